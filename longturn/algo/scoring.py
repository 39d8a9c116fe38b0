"""Fill the training columns of freshly collected turn rows (docs/design.md §4, §5), without grad.

old/ref logprobs are of the sampling policy softmax(logits / T) (like verl), values come from the
critic, next_value follows §4, token rewards carry −β·KL plus the turn's reward, and advantages /
returns are the dual-discount GAE of the whole batch. With a critic-free estimator
(``score_group_rows``) there are no values: each turn's advantage comes from its group of episodes
(algo/group_advantages.py). ``audit_gae`` recomputes either from a Parquet file's own columns and
metadata, so anyone can check a stored iteration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from longturn.algo.batches import autocast, pad_rows
from longturn.algo.gae import GAEParams, gae_for_table
from longturn.algo.group_advantages import CRITIC_FREE, GroupParams, turn_advantages
from longturn.algo.model_set import ModelSet
from longturn.algo.ppo import kl_penalty, token_rewards
from longturn.algo.turn_grid import TurnGrid
from longturn.engines.logprobs import pack_prompt_response
from longturn.vision.feed import RowImages, has_images
from longturn.trajectories import read_metadata

Row = dict[str, Any]
GAE_METADATA_KEYS = ("gamma_step", "lambda_step", "gamma_token", "lambda_token")
_GAE_INPUTS = ("values", "token_rewards", "next_value", "env_index", "step", "episode_id",
               "terminated", "aborted", "segment_end", "iteration")
_GROUP_INPUTS = ("token_rewards", "group_id", "episode_id", "turn", "observation", "aborted")


class ScoringSettings(Protocol):
    """The TrainerSettings fields scoring reads."""

    temperature: float
    kl_beta: float
    kl_estimator: str
    mini_batch_size: int  # scoring runs without grad, so whole mini-batches at a time
    bf16: bool
    share_prefix: bool


@dataclass
class Scored:
    """Per-row float32 arrays from one scoring pass (logprob lists empty when reused)."""

    old: list[np.ndarray] = field(default_factory=list)  # under softmax(logits / T)
    raw: list[np.ndarray] = field(default_factory=list)  # untempered, as engines report
    ref: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)


def _device(models: ModelSet) -> torch.device:
    return next(models.actor.parameters()).device


def _rows(matrix: torch.Tensor, lengths: list[int]) -> list[np.ndarray]:
    dense = matrix.float().cpu().numpy()
    return [dense[i, :n].copy() for i, n in enumerate(lengths)]


def score_batch(models: ModelSet, prompts: list[list[int]], responses: list[list[int]],
                settings: ScoringSettings, pad_id: int, logprobs: bool = True,
                bar: Any = None, values: bool = True,
                images: list[RowImages] | None = None) -> Scored:
    """Old / untempered / reference logprobs (when `logprobs`) and values (when `values`) of
    every row, a mini-batch at a time; per mini-batch the shared trunk runs once (ModelSet).
    `images[i]`: row i's frames and where they go (sequence mode with a vision-language
    model); with images no prompt prefix is shared. Rows are batched in length order (less
    padding) and returned in input order."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(responses[i]))
    prompts, responses = [prompts[i] for i in order], [responses[i] for i in order]
    images = [images[i] for i in order] if images else images
    out, size, device = Scored(), max(1, settings.mini_batch_size), _device(models)
    share_prefix = settings.share_prefix and not has_images(images)
    with models.scoring():  # each branch's prefix pass once for the whole call
        for start in range(0, len(prompts), size):
            chunk = responses[start : start + size]
            lengths = [len(r) for r in chunk]
            batch = pack_prompt_response(prompts[start : start + size], chunk, pad_id, device,
                                         share_prefix)
            frames = images[start : start + size] if images else None
            with autocast(settings.bf16, device), models.images(batch, frames):
                trunk = models.trunk(batch)
                if logprobs:
                    old, raw = models.policy_logprobs(batch, trunk, settings.temperature)
                    ref, _ = models.policy_logprobs(batch, trunk, settings.temperature, True)
                    out.old += _rows(old, lengths)
                    out.raw += _rows(raw, lengths)
                    out.ref += _rows(ref, lengths)
                if values:
                    out.values += _rows(models.values(batch, trunk), lengths)
            _advance(bar, len(chunk))
    return Scored(*(_unsorted(column, order) for column in
                    (out.old, out.raw, out.ref, out.values)))


def _unsorted(column: list[np.ndarray], order: list[int]) -> list[np.ndarray]:
    """A column computed in `order` put back in input order (empty stays empty)."""
    if not column:
        return column
    back: list[np.ndarray] = [column[0]] * len(order)
    for position, index in enumerate(order):
        back[index] = column[position]
    return back


def bootstrap_values(models: ModelSet, rows: list[Row], settings: ScoringSettings,
                     pad_id: int, bar: Any = None) -> dict[int, float]:
    """V(next observation) for every row that carries ``bootstrap_prompt_ids`` (and, sequence
    mode, its frames in ``bootstrap_images``)."""
    index = [i for i, r in enumerate(rows) if r.get("bootstrap_prompt_ids")]
    out: dict[int, float] = {}
    size, device = max(1, settings.mini_batch_size), _device(models)
    with models.scoring():
        for start in range(0, len(index), size):
            part = index[start : start + size]
            prompts = [list(rows[i]["bootstrap_prompt_ids"]) for i in part]
            frames = [rows[i].get("bootstrap_images") or [] for i in part]
            batch = pack_prompt_response(prompts, [[] for _ in part], pad_id, device,
                                         settings.share_prefix and not has_images(frames))
            with autocast(settings.bf16, device), models.images(batch, frames):
                v = models.state_values(batch, models.trunk(batch))
            out.update(zip(part, v.float().cpu().tolist()))
            _advance(bar, len(part))
    return out


def _advance(bar: Any, n: int) -> None:
    if bar is not None:
        bar.update(n)


def successors(rows: list[Row]) -> list[int]:
    """Index of the turn that continues each row's episode in this batch (same slot and
    iteration, next step, same episode_id), or -1: the TurnGrid's answer."""
    grid = TurnGrid.build([r["env_index"] for r in rows], [r["step"] for r in rows],
                          [r["episode_id"] for r in rows], [r.get("iteration", 0) for r in rows])
    return grid.next_row.tolist()


def next_values(rows: list[Row], values: list[np.ndarray], boot: dict[int, float]) -> np.ndarray:
    """next_value per docs/design.md §4: 0 if terminated (or aborted), V_{t+1,0} if the episode
    goes on in this batch, else the critic's value of the next observation (segment end, time limit)."""
    succ = successors(rows)
    out = np.zeros(len(rows), dtype=np.float32)
    for i, row in enumerate(rows):
        if row["aborted"] or row["terminated"]:
            continue
        if succ[i] >= 0 and not row["segment_end"]:
            out[i] = values[succ[i]][0]
        elif i in boot:
            out[i] = boot[i]
        elif succ[i] >= 0:
            out[i] = values[succ[i]][0]
        else:
            raise ValueError(f"row {i} (env {row['env_index']}, step {row['step']}): the episode "
                             "goes on but neither its next turn nor bootstrap_prompt_ids is here")
    return out


def kl_token_rewards(old: list[np.ndarray], ref: list[np.ndarray], rewards: list[float],
                     beta: float, estimator: str) -> list[np.ndarray]:
    """Per-row −β·KL(π‖π_ref) on each token plus the turn's reward on its last token."""
    lengths = [len(o) for o in old]
    if min(lengths, default=1) == 0:
        raise ValueError("a turn has zero response tokens: its reward would be lost "
                         "(docs/design.md §5)")
    old_t, ref_t = pad_rows(old), pad_rows(ref)
    mask = torch.arange(old_t.shape[1])[None, :] < torch.tensor(lengths)[:, None]
    kl = kl_penalty(old_t, ref_t, estimator)  # type: ignore[arg-type]
    out = token_rewards(kl, [float(r) for r in rewards], mask, beta).numpy()
    return [out[i, :n].astype(np.float32) for i, n in enumerate(lengths)]


def score_rows(rows: list[Row], models: ModelSet, settings: ScoringSettings,
               gae_params: GAEParams, pad_id: int, reuse_logprobs: bool = False,
               progress: bool = False) -> list[Row]:
    """Fill old_logprobs, ref_logprobs, values, next_value, token_rewards, advantages, returns
    (float32 lists) on one rank's rows, in place; returns the same list.

    Rows needing a bootstrap (segment end, time-limit truncation) carry ``bootstrap_prompt_ids``.
    ``reuse_logprobs`` keeps old/ref logprobs the rows already carry (the critic warm-up re-scores
    the same turns while the actor is frozen, so only values and GAE change).
    """
    if not rows:
        return rows
    prompts, responses = _token_lists(rows)
    reuse = reuse_logprobs and all(r.get("old_logprobs") is not None
                                   and r.get("ref_logprobs") is not None for r in rows)
    n_boot = sum(bool(r.get("bootstrap_prompt_ids")) for r in rows)
    bar = tqdm(total=len(rows) + n_boot, desc="score", unit="turn", disable=not progress,
               leave=False)
    # no_grad, not inference_mode: under ZeRO-3 the forward gathers parameters into buffers that
    # training reuses, and inference tensors cannot be saved for backward later.
    with torch.no_grad(), bar:
        scored = score_batch(models, prompts, responses, settings, pad_id, not reuse, bar)
        boot = bootstrap_values(models, rows, settings, pad_id, bar)
    if reuse:
        scored.old = [np.asarray(r["old_logprobs"], dtype=np.float32) for r in rows]
        scored.ref = [np.asarray(r["ref_logprobs"], dtype=np.float32) for r in rows]
    nv = next_values(rows, scored.values, boot)
    rewards = kl_token_rewards(scored.old, scored.ref, [r["reward"] for r in rows],
                               settings.kl_beta, settings.kl_estimator)
    _fill_scored(rows, scored, rewards, nv)
    columns = {k: [r.get(k, 0) if k == "iteration" else r[k] for r in rows] for k in _GAE_INPUTS}
    _store_advantages(rows, *gae_for_table(columns, gae_params))
    return rows


def _fill_scored(rows: list[Row], scored: Scored, rewards: list[np.ndarray],
                 next_value: np.ndarray | None) -> None:
    """Logprobs, token rewards, values and next_value of each row (both None without a critic,
    `next_value` None), and the engine-vs-trainer logprob gap when the engine reported logprobs."""
    critic = next_value is not None
    for i, row in enumerate(rows):
        row.update(old_logprobs=scored.old[i].tolist(), ref_logprobs=scored.ref[i].tolist(),
                   token_rewards=rewards[i].tolist(),
                   values=scored.values[i].tolist() if critic else None,
                   next_value=float(next_value[i]) if critic else None)
        if scored.raw and row.get("engine_logprobs") is not None:  # both untempered
            gap = np.abs(np.asarray(row["engine_logprobs"]) - scored.raw[i])
            row["logprob_gap"] = float(gap.mean())


def _store_advantages(rows: list[Row], advantages: list[np.ndarray],
                      returns: list[np.ndarray]) -> None:
    for row, adv, ret in zip(rows, advantages, returns):
        row["advantages"] = adv.astype(np.float32).tolist()
        row["returns"] = ret.astype(np.float32).tolist()


def _token_lists(rows: list[Row]) -> tuple[list[list[int]], list[list[int]]]:
    """Prompt and response ids of every row; a turn without response tokens is refused."""
    prompts = [list(r["prompt_ids"]) for r in rows]
    responses = [list(r["response_ids"]) for r in rows]
    empty = [i for i, r in enumerate(responses) if not r]
    if empty:
        raise ValueError(f"rows {empty} have zero response tokens: their reward would be lost "
                         "(docs/design.md §5); the engine must return at least one token per turn")
    return prompts, responses


def group_advantages_for_table(table: dict[str, list[Any]],
                               params: GroupParams) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-token advantages and returns of a critic-free estimator from turn columns: a turn's
    reward is the sum of its token rewards (env reward, penalty, −β·KL), and every token of the
    turn carries the turn's advantage and discounted return."""
    rewards = [float(np.sum(np.asarray(t, dtype=np.float64))) for t in table["token_rewards"]]
    advantages, returns = turn_advantages(
        table["group_id"], table["episode_id"], table["turn"], rewards, table["observation"],
        [bool(a) for a in table["aborted"]], params)
    widths = [len(t) for t in table["token_rewards"]]
    return ([np.full(n, a, dtype=np.float64) for n, a in zip(widths, advantages)],
            [np.full(n, r, dtype=np.float64) for n, r in zip(widths, returns)])


def score_group_rows(rows: list[Row], models: ModelSet, settings: ScoringSettings,
                     params: GroupParams, pad_id: int, progress: bool = False) -> list[Row]:
    """Critic-free scoring of one rank's rows (whole episodes in groups), in place: old/ref
    logprobs, token rewards, and each turn's group advantage and return on every token; values
    and next_value stay empty (null in Parquet)."""
    if not rows:
        return rows
    prompts, responses = _token_lists(rows)
    bar = tqdm(total=len(rows), desc="score", unit="turn", disable=not progress, leave=False)
    with torch.no_grad(), bar:
        scored = score_batch(models, prompts, responses, settings, pad_id, True, bar, False)
    rewards = kl_token_rewards(scored.old, scored.ref, [r["reward"] for r in rows],
                               settings.kl_beta, settings.kl_estimator)
    _fill_scored(rows, scored, rewards, None)
    columns = {k: [r.get(k) for r in rows] for k in _GROUP_INPUTS}
    _store_advantages(rows, *group_advantages_for_table(columns, params))
    return rows


def audit_gae(parquet_path: str | Path, gae_params: GAEParams | None = None) -> float:
    """Max |stored − recomputed| over advantages and returns of a scored turn file, for the
    estimator the file's metadata names (GAE when it names none); GAE parameters default to those
    recorded in the file's metadata."""
    meta = read_metadata(parquet_path)
    names = set(pq.read_schema(str(parquet_path)).names)
    algo = json.loads(meta["algo"]) if "algo" in meta else {}  # files written before it: GAE
    if algo.get("advantage") in CRITIC_FREE:
        columns = [c for c in (*_GROUP_INPUTS, "advantages", "returns") if c in names]
        table = pq.read_table(str(parquet_path), columns=columns).to_pydict()
        params = GroupParams.from_algo(algo, meta["gamma_step"])
        advantages, returns = group_advantages_for_table(table, params)
        return _max_error(table, advantages, returns)
    if gae_params is None:
        gae_params = GAEParams(*(float(meta[k]) for k in GAE_METADATA_KEYS))
    columns = [c for c in (*_GAE_INPUTS, "advantages", "returns") if c in names]
    table = pq.read_table(str(parquet_path), columns=columns).to_pydict()
    advantages, returns = gae_for_table(table, gae_params)
    return _max_error(table, advantages, returns)


def _max_error(table: dict[str, list[Any]], advantages: list[np.ndarray],
               returns: list[np.ndarray]) -> float:
    error = 0.0
    for stored, fresh in ((table["advantages"], advantages), (table["returns"], returns)):
        for row, (s, f) in enumerate(zip(stored, fresh)):
            if s is None or len(s) != len(f):
                raise ValueError(f"row {row}: stored advantages/returns missing or mis-sized")
            error = max(error, float(np.max(np.abs(np.asarray(s, dtype=np.float64) - f))))
    return error
