"""The no-grad passes scoring runs over a batch (docs/design.md §5): old, untempered and
reference logprobs and values of every (prompt, response) row, and the critic's value of the
states an episode goes on from after the batch (bootstraps).

old/ref logprobs are of the sampling policy softmax(logits / T) (like verl). What becomes of them
(token rewards, advantages, returns) is algo/sample_scoring.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from longturn.algo.batches import autocast
from longturn.algo.model_set import ModelSet
from longturn.engines.logprobs import pack_prompt_response
from longturn.vision.feed import RowImages, has_images

Row = dict[str, Any]
GAE_METADATA_KEYS = ("gamma_step", "lambda_step", "gamma_token", "lambda_token")


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
    `images[i]`: row i's frames and where they go (a conversation with a vision-language
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
    return [column[k] for k in np.argsort(order)] if column else column


def bootstrap_values(models: ModelSet, rows: list[Row], settings: ScoringSettings,
                     pad_id: int, bar: Any = None) -> dict[int, float]:
    """V(next observation) for every row that carries ``bootstrap_prompt_ids`` (and, in a
    conversation with images, its frames in ``bootstrap_images``)."""
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
