"""GAE over a packed chain (a whole episode as one sample, its replies a chain of turns:
algo/reply_chains.py) against a plain backward loop over the episode's tokens
(tests/gae_reference.py), through sample_advantages and through score_samples."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from gae_reference import packed_reference
from reference_forward import random_head_critic
from longturn.algo.gae import GAEParams
from longturn.algo.model_set import ModelSet
from longturn.algo.reply_chains import ADVANTAGE_INPUTS, sample_advantages
from longturn.algo.sample_scoring import score_samples
from longturn.rollout.samples import sample_from_episode
from longturn.trajectories import write_samples

PAD = 2


@dataclass
class Settings:
    temperature: float = 1.0
    kl_beta: float = 0.05
    kl_estimator: str = "k1"
    mini_batch_size: int = 4
    bf16: bool = False
    share_prefix: bool = False


def random_episode(rng: random.Random):
    mask, starts, ends = [], [], []
    for _ in range(rng.randint(1, 5)):
        mask += [0] * rng.randint(1, 6)
        starts.append(len(mask))
        mask += [1] * rng.randint(1, 7)
        ends.append(len(mask))
    mask += [0] * rng.randint(0, 3)
    n = len(mask)
    return ([rng.uniform(-1, 1) for _ in range(n)], [rng.uniform(-1, 1) for _ in range(n)],
            mask, starts, ends)


def packed(values, rewards, mask, starts, ends, done: bool, bootstrap: float,
           episode: str = "e") -> dict:
    """The episode as one sample (docs/design.md §4): the prompt up to its first reply, every
    list cut there; the last reply ends the episode or carries the bootstrap (a cut-short
    episode). Context values and rewards stay as drawn: GAE must not read them."""
    first = starts[0]
    replies = [{"start": s - first, "end": e - first, "turn": k, "step": k, "aborted": False,
                "segment_end": False, "terminated": done and k == len(starts) - 1,
                "truncated": not done and k == len(starts) - 1,
                "next_value": bootstrap if not done and k == len(starts) - 1 else None}
               for k, (s, e) in enumerate(zip(starts, ends))]
    return {"env_index": None, "episode_id": episode, "iteration": 0, "group_id": None,
            "values": values[first:], "token_rewards": rewards[first:],
            "loss_mask": mask[first:], "replies": replies}


def advantages(samples: list[dict], params: GAEParams) -> tuple[list, list]:
    return sample_advantages({k: [s.get(k) for s in samples] for k in ADVANTAGE_INPUTS},
                             params, None)


@pytest.mark.parametrize("seed", range(30))
def test_matches_the_plain_loop(seed):
    """One to three episodes in one table: each one's chain is its own plain loop."""
    rng = random.Random(seed)
    params = GAEParams(gamma_step=rng.choice([0.9, 0.99, 1.0]), lambda_step=rng.choice([0.8, 0.95]),
                       gamma_token=rng.choice([1.0, 0.97]), lambda_token=rng.choice([1.0, 0.9]))
    episodes, samples = [], []
    for k in range(rng.randint(1, 3)):
        values, rewards, mask, starts, ends = random_episode(rng)
        done, bootstrap = rng.random() < 0.5, rng.uniform(-1, 1)
        episodes.append((values, rewards, mask, starts[0], done, bootstrap))
        samples.append(packed(values, rewards, mask, starts, ends, done, bootstrap, f"e{k}"))
    adv, ret = advantages(samples, params)
    for (values, rewards, mask, first, done, bootstrap), a, r in zip(episodes, adv, ret):
        expected = packed_reference(values, rewards, mask, done, bootstrap, params)
        np.testing.assert_allclose(a, expected[first:], rtol=0, atol=1e-12)
        sampled = np.asarray(mask[first:], dtype=bool)
        np.testing.assert_allclose(r[sampled], (a + np.asarray(values[first:]))[sampled],
                                   rtol=0, atol=1e-12)
        assert (a[~sampled] == 0).all() and (r[~sampled] == 0).all()


def test_hand_computed_two_replies():
    # prompt [c], response [a0 a1], context, [b0], context; gamma_step 0.5, lambda_step 1,
    # token level 1. b0: 1 − 0.6 = 0.4; a1: 0 + 0.5·0.6 − 0.4 + 0.5·0.4 = 0.1;
    # a0: 0 + 0.4 − 0.2 + 0.1 = 0.3
    values = [9, 0.2, 0.4, 9, 0.6, 9]
    rewards = [9, 0.0, 0.0, 9, 1.0, 9]
    mask = [0, 1, 1, 0, 1, 0]
    p = GAEParams(gamma_step=0.5, lambda_step=1.0)
    (adv,), _ = advantages([packed(values, rewards, mask, [1, 4], [3, 5], True, 0.0)], p)
    assert adv.tolist() == pytest.approx([0.3, 0.1, 0, 0.4, 0])
    (cut,), _ = advantages([packed(values, rewards, mask, [1, 4], [3, 5], False, 2.0)], p)
    assert cut[3] == pytest.approx(1 + 0.5 * 2 - 0.6)


def test_an_episode_without_a_reply_gets_zeros_and_bad_spans_are_refused(tmp_path):
    """A packed sample with no reply (its first messages filled the token budget) trains
    nothing: zeros, its neighbours untouched. Replies out of order never reach a file."""
    p = GAEParams(gamma_step=0.9, lambda_step=0.9)
    values, rewards, mask = [0.5] * 6, [1.0] * 6, [0, 1, 1, 0, 1, 0]
    normal = packed(values, rewards, mask, [1, 4], [3, 5], True, 0.0, "a")
    empty = {**normal, "episode_id": "b", "values": [0.0], "token_rewards": [0.0],
             "loss_mask": [0], "replies": []}
    (alone,), _ = advantages([normal], p)
    (none, beside), _ = advantages([empty, normal], p)
    assert none.tolist() == [0.0]
    np.testing.assert_array_equal(beside, alone)
    record = {"episode_id": "s", "input_ids": list(range(8)), "loss_mask": [0, 1, 1, 0, 1, 0, 0, 0],
              "segment_starts": [1, 4], "segment_ends": [3, 5], "truncated": False}
    sample = sample_from_episode(record)
    sample["replies"].reverse()
    with pytest.raises(ValueError, match="out of order"):
        write_samples([sample], tmp_path / "s.parquet")
    short = {**normal, "token_rewards": normal["token_rewards"][:-1]}
    with pytest.raises(ValueError, match="token_rewards missing or not as long"):
        advantages([short], p)
    with pytest.raises(ValueError, match="have no values"):
        advantages([{**normal, "values": None}], p)


def test_scored_episodes_follow_the_plain_loop(tiny_model_dir):
    """score_samples on packed episodes, one cut short: advantages are the plain loop over the
    values and token rewards it stored, bootstrapped with the critic's value of the whole final
    context (what a one-token sample with that context as its prompt gets as its first value)."""
    torch.manual_seed(4)
    actor = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    critic = random_head_critic(tiny_model_dir, 0.5).eval()
    models = ModelSet(actor, copy.deepcopy(actor), critic)
    p = GAEParams(gamma_step=0.9, lambda_step=0.8, gamma_token=0.99, lambda_token=0.95)
    rng = random.Random(5)
    records = []
    for k, truncated in enumerate((False, True)):
        _, _, mask, starts, ends = random_episode(rng)
        records.append({"episode_id": f"e{k}", "iteration": 0,
                        "input_ids": [rng.randrange(10, 3000) for _ in mask], "loss_mask": mask,
                        "segment_starts": starts, "segment_ends": ends,
                        "segment_rewards": [rng.uniform(-1, 1) for _ in starts],
                        "truncated": truncated})
    done, cut = score_samples([sample_from_episode(r) for r in records], models, Settings(), p,
                              None, PAD)
    context = [*cut["prompt_ids"], *cut["response_ids"]]
    probe = sample_from_episode({"episode_id": "probe", "input_ids": [*context, 11],
                                 "loss_mask": [0] * len(context) + [1],
                                 "segment_starts": [len(context)],
                                 "segment_ends": [len(context) + 1], "truncated": False})
    (probe,) = score_samples([probe], models, Settings(), p, None, PAD)
    bootstrap = cut["replies"][-1]["next_value"]
    assert done["replies"][-1]["next_value"] is None
    assert bootstrap == pytest.approx(probe["values"][0], abs=1e-5)
    for sample, is_done in ((done, True), (cut, False)):
        expected = packed_reference(sample["values"], sample["token_rewards"],
                                    sample["loss_mask"], is_done, bootstrap or 0.0, p)
        np.testing.assert_allclose(sample["advantages"], expected, rtol=0, atol=1e-5)
        assert all(sample[k][i] == 0 for k in ("values", "advantages", "old_logprobs")
                   for i, m in enumerate(sample["loss_mask"]) if not m)
