"""score_samples (one scoring over samples, schema v2) gives the numbers of the two scorings it
replaces: score_rows / score_group_rows on window turn rows and score_sequences on whole-episode
records, compared through the converters (rollout/samples.py) on the tiny random model; and
audit_samples_file recomputes a written file's advantages and catches a tampered one."""

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

from longturn.algo.critic import ValueModel
from longturn.algo.gae import GAEParams
from longturn.algo.group_advantages import GroupParams
from longturn.algo.model_set import ModelSet
from longturn.algo.reply_chains import ADVANTAGE_INPUTS
from longturn.algo.sample_scoring import audit_samples_file, sample_advantages, score_samples
from longturn.algo.scoring import score_group_rows, score_rows
from longturn.algo.sequence_scoring import score_sequences
from longturn.errors import TrajectoryFileError
from longturn.rollout.samples import samples_from_episodes, samples_from_turns
from longturn.run.models import prepare_base_model
from longturn.trajectories import write_samples, write_turns
from longturn.vision.encoder import load_vision
from longturn.vision.frames import to_png
from vlm_fixtures import TOKENS_PER_IMAGE, build_tiny_llava

PAD = 2
GAE = GAEParams(gamma_step=0.9, lambda_step=0.8, gamma_token=0.99, lambda_token=0.95)
GAE_META = {"gamma_step": 0.9, "lambda_step": 0.8, "gamma_token": 0.99, "lambda_token": 0.95}
EXACT = ("old_logprobs", "ref_logprobs", "values")  # token for token
CLOSE = ("token_rewards", "advantages", "returns")  # within 1e-6


@dataclass
class Settings:
    temperature: float = 0.7
    kl_beta: float = 0.05
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
    critic = ValueModel.from_pretrained(tiny_model_dir, head_std=0.5).eval()
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
    """A whole episode as the sequence rollout records it: a prompt, then replies each followed
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


def assert_same(new: list[dict], expected: list[dict], gaps: bool = True) -> None:
    """Columns of score_samples equal the converted columns of the old scoring."""
    assert len(new) == len(expected)
    for i, (got, want) in enumerate(zip(new, expected)):
        for column in EXACT:
            assert got[column] == want[column], (i, column)
        for column in CLOSE:
            np.testing.assert_allclose(got[column], want[column], rtol=0, atol=1e-6,
                                       err_msg=f"sample {i} {column}")
        for k, (a, b) in enumerate(zip(got["replies"], want["replies"], strict=True)):
            assert a["next_value"] == b["next_value"], (i, k)
            if gaps:
                assert a["logprob_gap"] == b["logprob_gap"], (i, k)
    assert any(any(r) for s in new for r in (s["advantages"],))


def test_window_rows_with_gae_match_score_rows(models: ModelSet) -> None:
    old = score_rows(window_rows(), models, Settings(), GAE, PAD)
    new = score_samples(samples_from_turns(window_rows()), models, Settings(), GAE, None, PAD)
    assert_same(new, samples_from_turns(old))
    assert sum(r["replies"][0]["next_value"] == 0 for r in new) == 3  # two terminated, aborted


@pytest.mark.parametrize("estimator", ["grpo", "gigpo"])
def test_group_rows_match_score_group_rows(models: ModelSet, estimator: str) -> None:
    old = score_group_rows(group_rows(), models, Settings(), group(estimator), PAD)
    new = score_samples(samples_from_turns(group_rows()), models, Settings(), None,
                        group(estimator), PAD)
    assert_same(new, samples_from_turns(old))
    assert all(s["values"] is None and s["replies"][0]["next_value"] is None for s in new)


def test_reuse_logprobs_matches_score_rows(models: ModelSet) -> None:
    """The critic warm-up's re-score keeps the logprobs the rows carry (marked here)."""
    rows = score_rows(window_rows(), models, Settings(), GAE, PAD)
    for row in rows:
        row["old_logprobs"] = [x + 1.0 for x in row["old_logprobs"]]
    samples = samples_from_turns(copy.deepcopy(rows))
    old = score_rows(rows, models, Settings(), GAE, PAD, reuse_logprobs=True)
    new = score_samples(samples, models, Settings(), GAE, None, PAD, reuse_logprobs=True)
    assert_same(new, samples_from_turns(old))


def test_episodes_with_gae_match_score_sequences(models: ModelSet) -> None:
    old = score_sequences(episode_records(), models, Settings(), GAE, None, PAD)
    new = score_samples(samples_from_episodes(episode_records()), models, Settings(), GAE,
                        None, PAD)
    assert_same(new, samples_from_episodes(old), gaps=False)
    boots = [s["replies"][-1]["next_value"] for s in new if s["replies"]]
    assert [b is not None for b in boots] == [False, True, True, False, False]
    no_reply = new[3]
    assert no_reply["advantages"] == [0.0] and no_reply["values"] == [0.0]
    # the engine-vs-trainer gap, new for packed replies: over each reply's own tokens
    assert all(r["logprob_gap"] > 0 for s in new for r in s["replies"])


@pytest.mark.parametrize("estimator", ["grpo", "gigpo"])
def test_grouped_episodes_match_score_sequences(models: ModelSet, estimator: str) -> None:
    old = score_sequences(grouped_records(), models, Settings(), None, group(estimator), PAD)
    new = score_samples(samples_from_episodes(grouped_records()), models, Settings(), None,
                        group(estimator), PAD)
    assert_same(new, samples_from_episodes(old), gaps=False)


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
    critic = ValueModel.from_pretrained(base, head_std=0.5).eval()
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


def test_episodes_with_frames_match_score_sequences(vision_models) -> None:
    """Frames in the prompt and inside the response; a cut-short episode is bootstrapped on
    its final context with its frames."""
    models, image_id = vision_models

    def records() -> list[dict[str, Any]]:
        return [with_frames(record(21, 2, True), image_id, 1),
                with_frames(record(22, 3, False), image_id, 2)]

    old = score_sequences(records(), models, Settings(), GAE, None, PAD)
    new = score_samples(samples_from_episodes(records()), models, Settings(), GAE, None, PAD)
    assert len(new[0]["images"]) == 2 and new[0]["image_starts"][1] > len(new[0]["prompt_ids"])
    assert_same(new, samples_from_episodes(old), gaps=False)
    assert new[0]["replies"][-1]["next_value"] is not None


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
    path = write_turns(score_rows(window_rows(), models, Settings(), GAE, PAD),
                       tmp_path / "turns.parquet", GAE_META)
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
