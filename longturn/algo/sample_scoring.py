"""Fill the training columns of samples (schema v2, docs/design.md §4, §5) without grad, the same
way for a window-N turn (a sample with one reply) and a whole episode (a packed sample): logprobs
and values (algo/scoring.py); token rewards, −β·KL on sampled tokens plus each reply's reward on
its last token; then advantages and returns per reply (algo/reply_chains.py). Every per-token
column is 0 where loss_mask is 0 (context inside a packed response).

`audit_samples_file` recomputes advantages and returns from a file's own columns by the same rule.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from longturn.params.estimator import Estimator
from longturn.algo.gae import GAEParams
from longturn.algo.group_advantages import GroupParams
from longturn.algo.model_set import ModelSet
from longturn.algo.ppo import kl_penalty
from longturn.algo.reply_chains import (ADVANTAGE_INPUTS, grid_next_values, is_packed,
                                        reply_spans, sample_advantages, stored_next_value,
                                        turn_columns)
from longturn.algo.scoring import GAE_METADATA_KEYS, ScoringSettings, bootstrap_values, score_batch
from longturn.trajectories import read_metadata, read_table, require_samples
from longturn.vision.frames import from_png

Sample = dict[str, Any]


def score_samples(samples: list[Sample], models: ModelSet, settings: ScoringSettings,
                  gae_params: GAEParams | None, group_params: GroupParams | None, pad_id: int,
                  reuse_logprobs: bool = False, progress: bool = False) -> list[Sample]:
    """Fill old_logprobs, ref_logprobs, values, token_rewards, advantages, returns and each
    reply's next_value and logprob_gap on one rank's samples, in place; returns the same list.

    Exactly one of `gae_params` (a critic) / `group_params` (critic-free: values and next_value
    stay null). A sample without a reply (its first messages filled the token budget) gets zeros.
    ``reuse_logprobs`` keeps the old/ref logprobs the samples carry (the critic warm-up re-scores
    the same turns while the actor is frozen, so only values and advantages change)."""
    if (gae_params is None) == (group_params is None):
        raise ValueError("score_samples needs exactly one of gae_params and group_params")
    critic = gae_params is not None
    rows = [i for i, s in enumerate(samples) if s["replies"]]
    live = [samples[i] for i in rows]
    empty = [i for i in rows if any(int(r["end"]) <= int(r["start"])
                                    for r in samples[i]["replies"])]
    if empty:
        raise ValueError(f"samples {empty} have a reply of zero response tokens: its reward "
                         "would be lost (docs/design.md §5); the engine must return at least one "
                         "token per turn")
    reuse = reuse_logprobs and all(s.get("old_logprobs") is not None
                                   and s.get("ref_logprobs") is not None for s in live)
    frames = [sample_frames(s) for s in live]
    boot_rows = [_bootstrap_context(s, f) if critic else {} for s, f in zip(live, frames)]
    bar = tqdm(total=len(live) + sum(map(bool, boot_rows)), desc="score", unit="sample",
               disable=not progress, leave=False)
    # no_grad, not inference_mode: under ZeRO-3 the forward gathers parameters into buffers that
    # training reuses, and inference tensors cannot be saved for backward later.
    with torch.no_grad(), bar, models.keeping_trunk_rows():  # for the update that follows
        scored = score_batch(models, [list(s["prompt_ids"]) for s in live],
                             [list(s["response_ids"]) for s in live], settings, pad_id,
                             not reuse, bar, values=critic, images=frames)
        boot = bootstrap_values(models, boot_rows, settings, pad_id, bar) if critic else {}
    if reuse:
        scored.old = [np.asarray(s["old_logprobs"], dtype=np.float32) for s in live]
        scored.ref = [np.asarray(s["ref_logprobs"], dtype=np.float32) for s in live]
    for sample in samples:
        if not sample["replies"]:
            zeros = [0.0] * len(sample["response_ids"])
            sample.update(old_logprobs=zeros, ref_logprobs=zeros, token_rewards=zeros,
                          values=zeros if critic else None)
    for j, sample in enumerate(live):
        mask = np.asarray(sample["loss_mask"], dtype=np.float32)
        old, ref = scored.old[j] * mask, scored.ref[j] * mask
        rewards = sample_token_rewards(old, ref, mask, sample["replies"], settings.kl_beta,
                                       settings.kl_estimator)
        sample.update(old_logprobs=old.tolist(), ref_logprobs=ref.tolist(),
                      token_rewards=rewards.tolist(),
                      values=(scored.values[j] * mask).tolist() if critic else None)
        if scored.raw and sample.get("engine_logprobs") is not None:  # both untempered
            _logprob_gaps(sample, scored.raw[j])
    columns = {k: [s.get(k) for s in samples] for k in ADVANTAGE_INPUTS}  # the samples' lists
    _fill_next_values(columns, {rows[j]: v for j, v in boot.items()}, critic)
    for sample, a, r in zip(samples, *sample_advantages(columns, gae_params, group_params)):
        sample["advantages"] = a.astype(np.float32).tolist()
        sample["returns"] = r.astype(np.float32).tolist()
    return samples


def sample_frames(sample: Sample, prefix: str = "") -> list[tuple[int, np.ndarray]]:
    """A sample's frames (PNG bytes) with where each one's placeholders begin in
    prompt_ids + response_ids (prefix "bootstrap_": in bootstrap_prompt_ids); empty for a
    text-only sample."""
    pngs, starts = sample.get(f"{prefix}images") or [], sample.get(f"{prefix}image_starts") or []
    if len(pngs) != len(starts):
        raise ValueError(f"episode {sample.get('episode_id')!r}: {len(pngs)} {prefix}images but "
                         f"{len(starts)} {prefix}image_starts")
    return [(int(s), from_png(png)) for s, png in zip(starts, pngs)]


def _bootstrap_context(sample: Sample, frames: list[tuple[int, np.ndarray]]) -> dict[str, Any]:
    """What the critic values after a sample's last reply when its episode goes on beyond the
    sample: the next observation's prompt (a window row at a segment end or time limit; a
    conversation's history window cut short, with the window's frames), or, for a packed
    episode cut short (reply or token limit), its own final context and frames. Empty when
    nothing is bootstrapped."""
    if sample.get("bootstrap_prompt_ids"):
        return {"bootstrap_prompt_ids": list(sample["bootstrap_prompt_ids"]),
                "bootstrap_images": sample_frames(sample, "bootstrap_")}
    if is_packed(sample.get("env_index")) and sample["replies"][-1].get("truncated"):
        return {"bootstrap_prompt_ids": [*sample["prompt_ids"], *sample["response_ids"]],
                "bootstrap_images": frames}
    return {}


def sample_token_rewards(old: np.ndarray, ref: np.ndarray, loss_mask: np.ndarray,
                         replies: Sequence[Mapping[str, Any]], beta: float,
                         estimator: str) -> np.ndarray:
    """−β·KL(π‖π_ref) on each sampled token, plus each reply's reward on its last token
    (float32, as long as the response)."""
    kl = kl_penalty(torch.from_numpy(old), torch.from_numpy(ref), estimator)  # type: ignore[arg-type]
    sampled = torch.from_numpy(np.asarray(loss_mask) != 0)
    rewards = torch.where(sampled, -beta * kl, torch.zeros_like(kl)).numpy()
    for reply in replies:
        rewards[int(reply["end"]) - 1] += np.float32(reply["reward"])
    return rewards


def _logprob_gaps(sample: Sample, raw: np.ndarray) -> None:
    """Mean |engine − trainer| untempered logprob over each reply's tokens."""
    engine = np.asarray(sample["engine_logprobs"], dtype=np.float64)
    for reply in sample["replies"]:
        start, end = int(reply["start"]), int(reply["end"])
        reply["logprob_gap"] = float(np.abs(engine[start:end] - raw[start:end]).mean())


def _fill_next_values(columns: Mapping[str, Sequence[Any]], boot: dict[int, float],
                      critic: bool) -> None:
    """Each reply's next_value (reply_chains.stored_next_value), set in the reply dicts of
    `columns`; null without a critic."""
    spans = reply_spans(columns["replies"])
    if not critic or not spans:
        for replies in columns["replies"]:
            for reply in replies:
                reply["next_value"] = None
        return
    first = [columns["values"][span.sample][span.start] for span in spans]
    values = grid_next_values(turn_columns(columns, spans), spans, first, boot)
    for span, value in zip(spans, values):
        columns["replies"][span.sample][span.reply]["next_value"] = stored_next_value(
            columns["env_index"][span.sample], span, value, boot)


def audit_samples_file(parquet_path: str | Path) -> float:
    """Max |stored − recomputed| over advantages and returns of a scored sample file, with the
    estimator and discounts its metadata records (GAE when it names none)."""
    require_samples(parquet_path)
    meta = read_metadata(parquet_path)
    algo = json.loads(meta.get("algo", "{}"))
    gae, group = None, None
    if Estimator.named(algo.get("advantage", "gae")).has_critic:
        gae = GAEParams(*(float(meta[k]) for k in GAE_METADATA_KEYS))
    else:
        group = GroupParams.from_algo(algo, meta["gamma_step"])
    table = read_table(parquet_path, [*ADVANTAGE_INPUTS, "advantages", "returns"]).to_pydict()
    advantages, returns = sample_advantages(table, gae, group)
    error = 0.0
    for stored, fresh in ((table["advantages"], advantages), (table["returns"], returns)):
        for row, (s, f) in enumerate(zip(stored, fresh)):
            if s is None or len(s) != len(f):
                raise ValueError(f"{parquet_path} sample {row}: stored advantages/returns "
                                 "missing or mis-sized")
            error = max(error, float(np.max(np.abs(np.asarray(s, dtype=np.float64) - f),
                                            initial=0.0)))
    return error
