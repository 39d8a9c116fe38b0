"""score_samples (one scoring over samples, schema v2) on the tiny random model, window turns and
packed episodes alike, against expectations built apart from it: the next value after each reply
by the rules of docs/design.md §4 (bootstraps from the critic directly), GAE over each chain by the
plain loops of tests/gae_reference.py, group estimators fed each reply's reward, packed replies
scored like the same replies alone (frames included); and audit_samples_file recomputes a written
file's advantages and catches a tampered one."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM

from gae_reference import packed_reference, reference_gae
from longturn.algo.gae import GAEParams
from longturn.algo.group_advantages import GroupParams, turn_advantages
from longturn.algo.model_set import ModelSet
from longturn.algo.reply_chains import ADVANTAGE_INPUTS
from longturn.algo.sample_scoring import audit_samples_file, sample_advantages, score_samples
from longturn.errors import TrajectoryFileError
from longturn.rollout.samples import samples_from_episodes
from turn_rows import sample_from_turn, samples_from_turns
from reference_forward import random_head_critic, state_values
from longturn.run.models import prepare_base_model
from longturn.trajectories import (V1_SCHEMA_VERSION, file_metadata, rows_table, write_arrow,
                                   write_samples)
from longturn.vision.encoder import load_vision
from longturn.vision.frames import to_png
from vlm_fixtures import TOKENS_PER_IMAGE, build_tiny_llava

PAD = 2
GAE = GAEParams(gamma_step=0.9, lambda_step=0.8, gamma_token=0.99, lambda_token=0.95)
GAE_META = {"gamma_step": 0.9, "lambda_step": 0.8, "gamma_token": 0.99, "lambda_token": 0.95}
BETA = 0.05


@dataclass
class Settings:
    temperature: float = 0.7
    kl_beta: float = BETA
    kl_estimator: str = "k1"
    mini_batch_size: int = 3
    bf16: bool = False
    share_prefix: bool = False


def group(estimator: str) -> GroupParams:
    return GroupParams(estimator, gamma_step=0.9, norm_std=True, step_weight=0.5)


@pytest.fixture(scope="module")
def models(tiny_model_dir: str) -> ModelSet:
    """Actor, a perturbed reference (so KL is not 0) and a critic with a random head."""
    torch.manual_seed(11)
    actor = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ref = copy.deepcopy(actor)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    critic = random_head_critic(tiny_model_dir, 0.5).eval()
    return ModelSet(actor, ref, critic)


def turn_row(iteration: int, slot: int, step: int, episode: str, seed: int,
             **flags: Any) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    n = 1 + seed % 4
    row = {"iteration": iteration, "env_index": slot, "step": step, "turn": step,
           "episode_id": episode, "prompt_ids": rng.integers(10, 3000, 3 + seed % 5).tolist(),
           "response_ids": rng.integers(10, 3000, n).tolist(),
           "engine_logprobs": (rng.normal(size=n) - 3).tolist(), "reward": float(rng.normal()),
           "terminated": False, "truncated": False, "segment_end": step == 2, "aborted": False,
           "observation": f"state {seed % 3}"}
    row.update(flags)
    if (row["segment_end"] and not row["terminated"]) or row["truncated"]:
        row["bootstrap_prompt_ids"] = rng.integers(10, 3000, size=4).tolist()
    return row


def window_rows() -> list[dict[str, Any]]:
    """3 slots × 3 steps × 2 iterations, shuffled. Iteration 0 / 1:
    slot 0: a, a (terminated), b (segment end) / b, b, b (segment end)
    slot 1: c, c (time limit), d (segment end) / d, d (aborted: env failed), e (segment end)
    slot 2: f, f, f (segment end) / f (terminated), g, g (segment end)"""
    plan = {(0, 0): "aab", (0, 1): "ccd", (0, 2): "fff",
            (1, 0): "bbb", (1, 1): "dde", (1, 2): "fgg"}
    flags = {(0, 0, 1): {"terminated": True}, (0, 1, 1): {"truncated": True},
             (1, 1, 1): {"aborted": True}, (1, 2, 0): {"terminated": True}}
    rows = [turn_row(it, slot, step, plan[it, slot][step], 100 * it + 10 * slot + step,
                     **flags.get((it, slot, step), {}))
            for it in range(2) for step in range(3) for slot in range(3)]
    order = np.random.default_rng(3).permutation(len(rows))
    return [rows[i] for i in order]


def group_rows() -> list[dict[str, Any]]:
    """Whole episodes in two groups of two (critic-free collection), one aborted; observations
    repeat within a group (GiGPO's anchor states)."""
    rows, slot = [], 0
    for g, lengths in enumerate(((3, 2), (1, 3))):
        for e, length in enumerate(lengths):
            for t in range(length):
                rows.append(turn_row(0, slot, t, f"g{g}e{e}", 40 * g + 7 * e + t,
                                     group_id=f"g{g}", segment_end=t == length - 1,
                                     terminated=t == length - 1,
                                     aborted=(g, e, t) == (1, 1, 2)))
            slot += 1
    for row in rows:
        row.pop("bootstrap_prompt_ids", None)
    return rows


def record(seed: int, replies: int, truncated: bool, group_id: str | None = None,
           prompt_seed: int | None = None) -> dict[str, Any]:
    """A whole episode as the conversation rollout records it: a prompt, then replies each followed
    by context (tool results, the template's closing); with 0 replies the prompt alone."""
    rng = np.random.default_rng(seed)
    prompt = np.random.default_rng(seed if prompt_seed is None else prompt_seed)
    ids = prompt.integers(10, 2000, size=5).tolist()
    mask, starts, ends = [0] * len(ids), [], []
    for k in range(replies):
        if k:
            context = rng.integers(10, 2000, size=3).tolist()
            ids += context
            mask += [0] * len(context)
        starts.append(len(ids))
        n = int(rng.integers(2, 14))
        ids += rng.integers(10, 2000, size=n).tolist()
        mask += [1] * n
        ends.append(len(ids))
        ids.append(PAD)
        mask.append(0)
    engine = [float(x) * m for x, m in zip(rng.normal(size=len(ids)) - 3, mask)]
    return {"iteration": 0, "episode_id": f"ep{seed}", "task": "t", "episode_seed": seed,
            "input_ids": ids, "loss_mask": mask, "engine_logprobs": engine,
            "segment_starts": starts, "segment_ends": ends,
            "segment_rewards": rng.normal(size=replies).tolist(),
            "termination": "max_assistant_turns" if truncated else "done",
            "truncated": truncated, "success": not truncated, "group_id": group_id}


def episode_records() -> list[dict[str, Any]]:
    """Done and cut-short episodes of one to three replies, one without a reply."""
    return [record(1, 3, False), record(2, 3, True), record(3, 1, True), record(4, 0, True),
            record(5, 2, False), record(6, 1, False)]


def grouped_records() -> list[dict[str, Any]]:
    """Two groups of three from one prompt each (their first replies share an anchor)."""
    return [record(10 * g + e, 1 + (e + g) % 3, e == 2, f"g{g}", prompt_seed=g)
            for g in range(2) for e in range(3)]


def by_turn(samples: list[dict]) -> dict[tuple[int, int, int], dict]:
    """Window samples by (iteration, slot, step)."""
    return {(s["iteration"], s["env_index"], s["replies"][0]["step"]): s for s in samples}


def boot_value(models: ModelSet, prompt: list[int]) -> float:
    """The critic's value of a state, straight from the critic."""
    with torch.no_grad():
        return float(state_values(models.critic, [prompt], PAD)[0])


def assert_token_rewards(samples: list[dict]) -> None:
    """−β·KL (k1) on every sampled token, each reply's reward on its last, 0 on context."""
    for s in samples:
        kl = np.asarray(s["old_logprobs"], dtype=np.float64) - np.asarray(s["ref_logprobs"])
        want = -BETA * kl * np.asarray(s["loss_mask"])
        for reply in s["replies"]:
            want[reply["end"] - 1] += reply["reward"]
        np.testing.assert_allclose(s["token_rewards"], want, rtol=0, atol=1e-6)


def test_window_rows_follow_the_next_value_rules_and_gae_over_their_chains(
        models: ModelSet) -> None:
    """Two iterations, shuffled: the value after each turn is 0 (terminated, aborted), its
    successor's first value (same slot, iteration and episode, next step), else the critic's
    value of the bootstrap prompt; GAE runs along each slot's chain of one iteration, cut at
    episode ends, segment ends and aborted turns."""
    new = score_samples(samples_from_turns(window_rows()), models, Settings(), GAE, None, PAD)
    assert_token_rewards(new)
    turns = by_turn(new)
    for (it, slot, step), s in turns.items():
        reply = s["replies"][0]
        after = turns.get((it, slot, step + 1))
        if reply["terminated"] or reply["aborted"]:
            want = 0.0
        elif after is not None and after["episode_id"] == s["episode_id"] and (
                not reply["segment_end"]):
            want = after["values"][0]
        else:
            want = boot_value(models, s["bootstrap_prompt_ids"])
        assert reply["next_value"] == pytest.approx(want, abs=1e-5), (it, slot, step)
    assert sum(s["replies"][0]["next_value"] == 0 for s in new) == 3  # two terminated, aborted
    for it, slot in {(it, slot) for it, slot, _ in turns}:
        chain = [turns[it, slot, step] for step in range(3)]
        replies = [s["replies"][0] for s in chain]
        # §5: the advantage flows back from the next turn of the same episode unless either
        # turn is aborted (a failed env) or this one terminated or ended the segment
        carries = [float(not (r["terminated"] or r["aborted"] or r["segment_end"])
                         and not nxt["replies"][0]["aborted"]
                         and nxt["episode_id"] == s["episode_id"])
                   for s, r, nxt in zip(chain, replies, chain[1:])] + [0.0]
        adv, ret = reference_gae(
            np.concatenate([s["values"] for s in chain]),
            np.concatenate([s["token_rewards"] for s in chain]),
            [len(s["response_ids"]) for s in chain], [r["next_value"] for r in replies],
            carries, GAE)
        np.testing.assert_allclose(np.concatenate([s["advantages"] for s in chain]), adv,
                                   rtol=0, atol=1e-5, err_msg=f"iteration {it} slot {slot}")
        np.testing.assert_allclose(np.concatenate([s["returns"] for s in chain]), ret,
                                   rtol=0, atol=1e-5)


def expected_group_advantages(samples: list[dict], params: GroupParams) -> list[np.ndarray]:
    """The group estimator with each reply a turn whose reward is its row's token rewards from
    the previous reply's end to its own; every token of a reply gets the reply's advantage."""
    spans = [(i, k, r) for i, s in enumerate(samples) for k, r in enumerate(s["replies"])]
    rewards = [float(np.sum(samples[i]["token_rewards"][
        samples[i]["replies"][k - 1]["end"] if k else 0:r["end"]])) for i, k, r in spans]
    adv, _ = turn_advantages([samples[i]["group_id"] for i, _, _ in spans],
                             [samples[i]["episode_id"] for i, _, _ in spans],
                             [r["turn"] for _, _, r in spans], rewards,
                             [r["observation"] for _, _, r in spans],
                             [bool(r["aborted"]) for _, _, r in spans], params)
    out = [np.zeros(len(s["response_ids"])) for s in samples]
    for (i, _, r), a in zip(spans, adv):
        out[i][r["start"]:r["end"]] = a
    return out


@pytest.mark.parametrize("estimator", ["grpo", "gigpo"])
def test_group_rows_get_their_estimator_per_reply(models: ModelSet, estimator: str) -> None:
    new = score_samples(samples_from_turns(group_rows()), models, Settings(), None,
                        group(estimator), PAD)
    assert all(s["values"] is None and s["replies"][0]["next_value"] is None for s in new)
    assert_token_rewards(new)
    for got, want in zip(new, expected_group_advantages(new, group(estimator))):
        np.testing.assert_allclose(got["advantages"], want, rtol=0, atol=1e-6)
    aborted = [s for s in new if s["episode_id"] == "g1e1"]  # an env failure: out of the groups
    assert aborted and all(not any(s["advantages"]) for s in aborted)
    assert any(any(s["advantages"]) for s in new)


def test_episodes_with_gae_follow_the_plain_loop(models: ModelSet) -> None:
    """Each packed episode's replies form their own chain; one cut short is bootstrapped with
    the critic's value of its whole final context; one without a reply gets zeros."""
    new = score_samples(samples_from_episodes(episode_records()), models, Settings(), GAE,
                        None, PAD)
    assert_token_rewards(new)
    boots = [s["replies"][-1]["next_value"] for s in new if s["replies"]]
    assert [b is not None for b in boots] == [False, True, True, False, False]
    for s in new:
        if not s["replies"]:
            continue
        cut = s["replies"][-1]["truncated"]
        boot = s["replies"][-1]["next_value"]
        if cut:
            assert boot == pytest.approx(
                boot_value(models, [*s["prompt_ids"], *s["response_ids"]]), abs=1e-5)
        want = packed_reference(s["values"], s["token_rewards"], s["loss_mask"], not cut,
                                boot or 0.0, GAE)
        np.testing.assert_allclose(s["advantages"], want, rtol=0, atol=1e-5)
        assert all(s["values"][i] == 0 for i, m in enumerate(s["loss_mask"]) if not m)
    no_reply = new[3]
    assert no_reply["advantages"] == [0.0] and no_reply["values"] == [0.0]
    # the engine-vs-trainer gap, new for packed replies: over each reply's own tokens
    assert all(r["logprob_gap"] > 0 for s in new for r in s["replies"])


@pytest.mark.parametrize("estimator", ["grpo", "gigpo"])
def test_grouped_episodes_get_their_estimator_per_reply(models: ModelSet,
                                                        estimator: str) -> None:
    new = score_samples(samples_from_episodes(grouped_records()), models, Settings(), None,
                        group(estimator), PAD)
    assert_token_rewards(new)
    firsts = {s["group_id"]: s["replies"][0]["observation"] for s in new}
    assert all(s["replies"][0]["observation"] == firsts[s["group_id"]] for s in new)  # anchors
    for got, want in zip(new, expected_group_advantages(new, group(estimator))):
        np.testing.assert_allclose(got["advantages"], want, rtol=0, atol=1e-6)
    assert all(s["values"] is None for s in new) and any(any(s["advantages"]) for s in new)


@pytest.fixture(scope="module")
def vision_models(smollm2_tokenizer_dir: str, tmp_path_factory) -> tuple[ModelSet, int]:
    """The tiny LLaVA as the base-model stage leaves it, as actor, reference and critic with its
    image side; and its `<image>` id."""
    llava = build_tiny_llava(smollm2_tokenizer_dir, tmp_path_factory.mktemp("tiny_llava"))
    base = str(prepare_base_model(str(llava), tmp_path_factory.mktemp("vlm") / "base"))
    torch.manual_seed(5)
    actor = AutoModelForCausalLM.from_pretrained(base).eval()
    ref = copy.deepcopy(actor)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    critic = random_head_critic(base, 0.5).eval()
    vision = load_vision(base)
    return ModelSet(actor, ref, critic, vision=vision), vision.image_token_id


def with_frames(rec: dict[str, Any], image_id: int, seed: int) -> dict[str, Any]:
    """A frame in the first context and one in the context after the first reply (both before
    and inside the packed response)."""
    rng = np.random.default_rng(seed)
    ids, mask, starts, ends = [], [], [], []
    cuts = [0, *rec["segment_ends"]]
    for k, (s, e) in enumerate(zip(rec["segment_starts"], rec["segment_ends"])):
        context = rec["input_ids"][cuts[k]:s]
        if k < 2:
            context = context[:1] + [image_id] * TOKENS_PER_IMAGE + context[1:]
        ids += context
        mask += [0] * len(context)
        starts.append(len(ids))
        ids += rec["input_ids"][s:e]
        mask += [1] * (e - s)
        ends.append(len(ids))
    ids += rec["input_ids"][cuts[-1]:]
    mask += [0] * (len(ids) - len(mask))
    at = [i for i, t in enumerate(ids) if t == image_id][::TOKENS_PER_IMAGE]
    pngs = [to_png(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)) for _ in at]
    engine = [0.0] * len(ids)
    return {**rec, "input_ids": ids, "loss_mask": mask, "segment_starts": starts,
            "segment_ends": ends, "engine_logprobs": engine, "images": pngs, "image_starts": at}


def alone(sample: dict, start: int, response: list[int], slot: int) -> dict:
    """`response` after a packed sample's context up to its response token `start`, as a window
    turn of its own: that context (and its frames) the prompt; it ends its episode, so nothing
    bootstraps."""
    at = len(sample["prompt_ids"]) + start
    ids = [*sample["prompt_ids"], *sample["response_ids"]]
    frames = [(p, png) for p, png in zip(sample["image_starts"], sample["images"]) if p < at]
    return sample_from_turn({
        "iteration": 0, "env_index": slot, "step": 0, "turn": 0, "episode_id": f"alone{slot}",
        "prompt_ids": ids[:at], "response_ids": response, "reward": 0.0,
        "terminated": True, "segment_end": True, "aborted": False,
        "images": [png for _, png in frames], "image_starts": [p for p, _ in frames]})


def test_episodes_with_frames_score_like_their_replies_alone(vision_models) -> None:
    """Frames in the prompt and inside the response: each packed reply's logprobs and values are
    those of the same reply scored alone after the same context and frames; a cut-short episode
    is bootstrapped on its final context with all its frames."""
    models, image_id = vision_models

    def records() -> list[dict[str, Any]]:
        return [with_frames(record(21, 2, True), image_id, 1),
                with_frames(record(22, 3, False), image_id, 2)]

    new = score_samples(samples_from_episodes(records()), models, Settings(), GAE, None, PAD)
    assert len(new[0]["images"]) == 2 and new[0]["image_starts"][1] > len(new[0]["prompt_ids"])
    spans = [(s, r["start"], r["end"]) for s in new for r in s["replies"]]
    replies = [alone(s, a, s["response_ids"][a:b], j) for j, (s, a, b) in enumerate(spans)]
    probe = alone(new[0], len(new[0]["response_ids"]), [11], len(spans))  # V(final context)
    singles = score_samples(replies + [probe], models, Settings(), GAE, None, PAD)
    for (s, a, b), single in zip(spans, singles):
        for name in ("old_logprobs", "ref_logprobs", "values"):
            np.testing.assert_allclose(s[name][a:b], single[name], rtol=0, atol=1e-5,
                                       err_msg=name)
    assert new[0]["replies"][-1]["next_value"] == pytest.approx(singles[-1]["values"][0],
                                                                abs=1e-5)
    blind = samples_from_episodes(records())
    for s in blind:
        s["images"], s["image_starts"] = None, None
    score_samples(blind, models, Settings(), GAE, None, PAD)
    assert not np.allclose(blind[0]["values"], new[0]["values"])  # the frames reach the models


def test_a_packed_chain_stays_its_own() -> None:
    """Window rows and packed episodes in one table: each one's advantages are what they are
    alone (a packed row's replies link only to each other, never to a slot's turns)."""
    rng = np.random.default_rng(0)
    window = samples_from_turns(window_rows())
    packed = samples_from_episodes(episode_records())
    for sample in window + packed:
        n = len(sample["response_ids"])
        mask = np.asarray(sample["loss_mask"], dtype=float)
        sample["values"] = (rng.normal(size=n) * mask).tolist()
        sample["token_rewards"] = (rng.normal(size=n) * mask).tolist()
        for reply in sample["replies"]:
            if sample.get("env_index") is not None:
                reply["next_value"] = float(rng.normal())

    def advantages(samples: list[dict]) -> list[np.ndarray]:
        return sample_advantages({k: [s.get(k) for s in samples] for k in ADVANTAGE_INPUTS},
                                 GAE, None)[0]

    together = advantages(window + packed)
    for got, want in zip(together, advantages(window) + advantages(packed)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", ["window", "episodes", "gigpo"])
def test_audit_finds_nothing_then_the_tampered_advantage(models: ModelSet, tmp_path: Path,
                                                        case: str) -> None:
    if case == "window":
        samples, algo = samples_from_turns(window_rows()), {"advantage": "gae"}
        score_samples(samples, models, Settings(), GAE, None, PAD)
    elif case == "episodes":
        samples, algo = samples_from_episodes(episode_records()), {"advantage": "gae"}
        score_samples(samples, models, Settings(), GAE, None, PAD)
    else:
        samples = samples_from_episodes(grouped_records())
        algo = {"advantage": "gigpo", "norm_std": True, "step_weight": 0.5}
        score_samples(samples, models, Settings(), None, group("gigpo"), PAD)
    path = write_samples(samples, tmp_path / "part-00.parquet", {**GAE_META, "algo": algo})
    assert audit_samples_file(path) < 1e-6
    table = pq.read_table(path).to_pylist()
    reply = table[1]["replies"][-1]
    table[1]["advantages"][reply["end"] - 1] += 0.5
    bad = write_samples(table, tmp_path / "bad.parquet", {**GAE_META, "algo": algo})
    assert audit_samples_file(bad) == pytest.approx(0.5, abs=1e-5)


def test_audit_refuses_a_version_1_file(models: ModelSet, tmp_path: Path) -> None:
    samples = score_samples(samples_from_turns(window_rows()), models, Settings(), GAE, None, PAD)
    path = write_arrow(rows_table(samples, None), tmp_path / "turns.parquet",
                       file_metadata(GAE_META, version=V1_SCHEMA_VERSION))
    with pytest.raises(TrajectoryFileError, match="schema version 1"):
        audit_samples_file(path)


def test_refuses_an_empty_reply_and_a_missing_bootstrap(models: ModelSet) -> None:
    samples = samples_from_turns(window_rows())
    samples[0]["response_ids"], samples[0]["loss_mask"] = [], []
    samples[0]["replies"][0]["end"] = 0
    with pytest.raises(ValueError, match="zero response tokens"):
        score_samples(samples, models, Settings(), GAE, None, PAD)
    samples = samples_from_turns(window_rows())
    cut = next(s for s in samples if s["replies"][0]["segment_end"])
    cut["bootstrap_prompt_ids"] = None
    with pytest.raises(ValueError, match="bootstrap_prompt_ids"):
        score_samples(samples, models, Settings(), GAE, None, PAD)
    with pytest.raises(ValueError, match="exactly one"):
        score_samples(samples, models, Settings(), GAE, group("grpo"), PAD)
