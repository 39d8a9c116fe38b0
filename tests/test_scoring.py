"""score_samples on window turns (samples of one reply): next_value rules (docs/design.md §4), KL
token rewards, GAE that passes the Parquet audit, tempered logprobs; audit_samples_file catches a
tampered file."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM

from longturn.algo.critic import ValueModel
from longturn.algo.gae import GAEParams
from longturn.algo.model_set import ModelSet
from longturn.algo.sample_scoring import audit_samples_file, score_samples
from turn_rows import samples_from_turns
from reference_forward import forward_logprobs, random_head_critic, state_values
from longturn.trajectories import write_samples

PAD = 2
GAE = GAEParams(gamma_step=0.9, lambda_step=0.8)
GAE_META = {"gamma_step": 0.9, "lambda_step": 0.8, "gamma_token": 1.0, "lambda_token": 1.0}
BETA = 0.05


@dataclass
class Settings:
    temperature: float = 0.7
    kl_beta: float = BETA
    kl_estimator: str = "k1"
    mini_batch_size: int = 2
    bf16: bool = False
    share_prefix: bool = False


@pytest.fixture(scope="module")
def models(tiny_model_dir: str) -> tuple[torch.nn.Module, torch.nn.Module, ValueModel]:
    """Actor, a perturbed reference (so KL is not 0) and a critic with a random head."""
    torch.manual_seed(7)
    actor = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ref = copy.deepcopy(actor)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    critic = random_head_critic(tiny_model_dir, 0.5).eval()
    return actor, ref, critic


def _row(slot: int, step: int, episode: str, seed: int, **flags) -> dict:
    rng = np.random.default_rng(seed)
    row = {"iteration": 0, "env_index": slot, "step": step, "turn": step, "episode_id": episode,
           "prompt_ids": rng.integers(10, 3000, size=3 + seed % 4).tolist(),
           "response_ids": rng.integers(10, 3000, size=1 + seed % 3).tolist(),
           "reward": float(rng.normal()), "terminated": False, "truncated": False,
           "segment_end": step == 2, "aborted": False}
    row.update(flags)
    if (row["segment_end"] and not row["terminated"]) or row["truncated"]:
        row["bootstrap_prompt_ids"] = rng.integers(10, 3000, size=4).tolist()
    return row


def hand_rows() -> list[dict]:
    """3 slots × 3 steps, in collector order (step, slot).

    slot 0: a, a (terminated), b (restarted; segment end)
    slot 1: c, c (time-limit truncation), d (segment end)
    slot 2: e, e (aborted: env failed), f (segment end)
    """
    plan = {0: ["a", "a", "b"], 1: ["c", "c", "d"], 2: ["e", "e", "f"]}
    flags = {(0, 1): {"terminated": True}, (1, 1): {"truncated": True}, (2, 1): {"aborted": True}}
    return [_row(slot, step, plan[slot][step], 10 * slot + step + 1, **flags.get((slot, step), {}))
            for step in range(3) for slot in range(3)]


def score(rows: list[dict], models, settings: Settings | None = None, **kw) -> list[dict]:
    """Turn rows as samples of one reply, scored with GAE."""
    return score_samples(samples_from_turns(rows), ModelSet(*models), settings or Settings(), GAE,
                         None, PAD, **kw)


@pytest.fixture(scope="module")
def scored(models) -> list[dict]:
    return score(hand_rows(), models)


def _find(samples: list[dict], slot: int, step: int) -> dict:
    return next(s for s in samples if s["env_index"] == slot and s["replies"][0]["step"] == step)


def _reply(sample: dict) -> dict:
    """A window sample's one reply."""
    (reply,) = sample["replies"]
    return reply


def test_next_value_rules(scored: list[dict], models) -> None:
    critic = models[2]
    with torch.no_grad():
        def boot(row: dict) -> float:
            return float(state_values(critic, [row["bootstrap_prompt_ids"]], PAD)[0])

        expected = {
            (0, 0): _find(scored, 0, 1)["values"][0],  # continues in the batch: V_{t+1,0}
            (0, 1): 0.0,  # terminated
            (1, 1): boot(_find(scored, 1, 1)),  # time-limit truncation: V(next observation)
            (2, 0): _find(scored, 2, 1)["values"][0],  # next turn aborted: its state value
            (2, 1): 0.0,  # aborted
        }
        for slot in range(3):  # segment ends bootstrap from the critic
            expected[(slot, 2)] = boot(_find(scored, slot, 2))
        expected[(1, 0)] = _find(scored, 1, 1)["values"][0]
    for (slot, step), value in expected.items():
        assert _reply(_find(scored, slot, step))["next_value"] == pytest.approx(value, abs=1e-5), (
            slot, step)
    assert all(r["values"][0] != 0 for r in scored)


def test_token_rewards_carry_kl_and_reward(scored: list[dict]) -> None:
    for row in scored:
        kl = np.asarray(row["old_logprobs"]) - np.asarray(row["ref_logprobs"])
        assert len(row["token_rewards"]) == len(row["response_ids"])
        assert sum(row["token_rewards"]) == pytest.approx(_reply(row)["reward"] - BETA * kl.sum(),
                                                          abs=1e-5)
        np.testing.assert_allclose(row["token_rewards"][:-1], -BETA * kl[:-1], atol=1e-6)
    assert any(abs(r["old_logprobs"][0] - r["ref_logprobs"][0]) > 1e-3 for r in scored)


def test_returns_follow_the_rule(scored: list[dict]) -> None:
    """γ_token = λ_token = 1: return at token 0 = Σ token rewards + γ_step·(bootstrap) when the
    carry is cut (terminal, segment end, truncation), independently of the GAE code."""
    for slot, step in [(0, 1), (0, 2), (1, 1), (1, 2), (2, 2)]:
        row = _find(scored, slot, step)
        target = sum(row["token_rewards"]) + GAE.gamma_step * _reply(row)["next_value"]
        assert row["returns"][0] == pytest.approx(target, abs=1e-5)
        np.testing.assert_allclose(np.asarray(row["returns"]) - row["values"], row["advantages"],
                                   atol=1e-5)


def test_audit_passes_and_catches_tampering(scored: list[dict], tmp_path: Path) -> None:
    path = write_samples(scored, tmp_path / "samples.parquet", GAE_META)
    assert audit_samples_file(path) < 1e-5
    table = pq.read_table(path).to_pylist()
    table[0]["advantages"] = [a + 0.5 for a in table[0]["advantages"]]
    bad = write_samples(table, tmp_path / "bad.parquet", GAE_META)
    assert audit_samples_file(bad) == pytest.approx(0.5, abs=1e-4)


def test_old_logprobs_match_forward_logprobs_at_t1(models) -> None:
    actor, ref, critic = models
    rows = score(hand_rows(), models, Settings(temperature=1.0))
    plain = forward_logprobs(actor, [r["prompt_ids"] for r in rows],
                             [r["response_ids"] for r in rows])
    for row, expected in zip(rows, plain):
        np.testing.assert_allclose(row["old_logprobs"], expected, atol=1e-5)
    tempered = score(hand_rows(), models, Settings(temperature=0.7))
    assert not np.allclose(tempered[0]["old_logprobs"], rows[0]["old_logprobs"])


def test_bf16_scoring_is_close(models, scored: list[dict]) -> None:
    rows = score(hand_rows(), models, replace(Settings(), bf16=True))
    for fast, exact in zip(rows, scored):
        np.testing.assert_allclose(fast["old_logprobs"], exact["old_logprobs"], atol=0.1)
        np.testing.assert_allclose(fast["values"], exact["values"], atol=0.1)


def test_rejects_empty_response_and_missing_bootstrap(models) -> None:
    rows = hand_rows()
    rows[0]["response_ids"] = []
    with pytest.raises(ValueError, match="zero response tokens"):
        score(rows, models)
    rows = hand_rows()
    del next(r for r in rows if r["env_index"] == 1 and r["step"] == 2)["bootstrap_prompt_ids"]
    with pytest.raises(ValueError, match="bootstrap_prompt_ids"):
        score(rows, models)


def test_reuse_logprobs_keeps_policy_columns_and_refreshes_values(models) -> None:
    """The critic warm-up re-scores with the actor frozen: old/ref logprobs are kept as they are,
    values and GAE targets come from the current critic."""
    actor, ref, critic = models
    rows = score(hand_rows(), models)
    old = [list(r["old_logprobs"]) for r in rows]
    for r in rows:
        r["old_logprobs"] = [x + 1.0 for x in r["old_logprobs"]]  # a marker a recompute would undo
    moved = copy.deepcopy(critic)
    with torch.no_grad():
        moved.value_head.bias.add_(1.0)
    again = score_samples(rows, ModelSet(actor, ref, moved), Settings(), GAE, None, PAD,
                          reuse_logprobs=True)
    for row, before in zip(again, old):
        assert row["old_logprobs"] == pytest.approx([x + 1.0 for x in before])
    fresh = score(hand_rows(), (actor, ref, moved))
    for row, expected in zip(again, fresh):
        assert row["values"] == pytest.approx(expected["values"], abs=1e-6)
        assert row["ref_logprobs"] == pytest.approx(expected["ref_logprobs"], abs=1e-6)


def test_rows_batched_in_length_order_come_back_in_input_order(models) -> None:
    """score_batch batches rows by length (less padding) and returns them as given: each row's
    numbers are what it gets scored alone."""
    from longturn.algo.scoring import score_batch
    actor, ref, critic = models
    rows = hand_rows()
    prompts, responses = [r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows]
    assert sorted(map(len, responses)) != [len(r) for r in responses]  # the order matters here
    with torch.no_grad():
        both = score_batch(ModelSet(actor, ref, critic), prompts, responses, Settings(), PAD)
        alone = [score_batch(ModelSet(actor, ref, critic), prompts[i:i + 1], responses[i:i + 1],
                             Settings(), PAD) for i in range(len(rows))]
    for i, one in enumerate(alone):
        for got, want in zip((both.old, both.raw, both.ref, both.values),
                             (one.old, one.raw, one.ref, one.values)):
            np.testing.assert_allclose(got[i], want[0], atol=1e-5)


def test_micro_batches_hold_rows_of_like_length_and_mini_batches_do_not_change() -> None:
    from longturn.algo.ppo_steps import schedule
    lengths = [5, 90, 7, 60, 3, 80, 8, 70, 6, 50, 9, 40]
    plain = list(schedule(12, 6, 2, np.random.default_rng(0)))
    ordered = list(schedule(12, 6, 2, np.random.default_rng(0), lengths))
    for (mini_a, _), (mini_b, micros) in zip(plain, ordered):
        assert list(mini_a) == list(mini_b)  # the optimizer steps sum the same rows
        flat = np.concatenate(micros)
        assert sorted(flat) == sorted(mini_b)
        assert [lengths[i] for i in flat] == sorted(lengths[i] for i in mini_b)
