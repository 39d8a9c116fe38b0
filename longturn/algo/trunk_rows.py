"""Each scored row's frozen-trunk output, kept for the update that follows and warm-up refits.

Why: the trunk (embedding and the layers below the LoRA adapters, `trunk.py`) never trains, so
its output for a row is the same in scoring, in every epoch and micro-batch of the update, and in
each critic warm-up refit. Scoring computes it anyway: each row's hidden states over its own
(non-prefix) columns are kept unpadded, with the prefix pass they followed, and a later batch of
the same rows, packed any other way, is assembled from them instead of run through the layers.

A row is found by its tokens, which are all the trunk sees (vision models, whose frames change
the embedding, keep nothing), and only under the autocast dtype and trunk weights it was computed
with. What is kept: one scoring call's rows and bootstrap prompts, less their shared prefixes,
× hidden size × the bytes of the trunk's output dtype (fp32 under fp32 weights).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from longturn.engines.logprobs import PackedBatch
from longturn.engines.prefix_memo import autocast_key, weights_version

Key = tuple[int, ...]


@dataclass
class _Row:
    prefix: torch.Tensor | None  # [C, H]: the shared prefix's pass the row was packed after
    own: torch.Tensor  # [n, H]: the row's own columns

    def columns(self, cut: int, length: int) -> torch.Tensor:
        """Hidden states of positions cut .. length-1 of the row (prefix and own columns)."""
        kept_cut = length - self.own.shape[0]
        if cut >= kept_cut:  # a row kept with no prefix has kept_cut 0
            return self.own[cut - kept_cut:]
        return torch.cat([self.prefix[cut:kept_cut], self.own])


def _spans(batch: PackedBatch) -> list[tuple[Key, int, int]]:
    """(all tokens, first own column, own token count) of each row: prompts are left-padded and
    responses right-padded, so a row's own tokens are one run of columns."""
    prefix = [] if batch.prefix_ids is None else batch.prefix_ids[0].tolist()
    mask = batch.attention_mask[:, -batch.input_ids.shape[1]:]
    firsts, counts = mask.argmax(1).tolist(), mask.sum(1).tolist()
    return [(tuple(prefix + ids[f:f + n]), f, n)
            for ids, f, n in zip(batch.input_ids.tolist(), firsts, counts)]


class TrunkRows:
    """Trunk outputs of the rows of the latest scoring call (`keeping`)."""

    def __init__(self) -> None:
        self._rows: dict[Key, _Row] = {}
        self._stamp: tuple | None = None
        self._met: set[Key] | None = None  # rows met inside `keeping`
        self.hits = self.misses = 0  # batches assembled / run through the layers

    @contextmanager
    def keeping(self) -> Iterator[None]:
        """Rows the trunk runs over inside are kept; rows kept earlier and not met again are
        dropped at the end (the next update trains on this call's rows only)."""
        self._met = set()
        try:
            yield
        finally:
            self._rows = {k: self._rows[k] for k in self._met if k in self._rows}
            self._met = None

    def clear(self) -> None:
        self._rows.clear()

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, batch: PackedBatch, modules: Iterable[nn.Module],
            prefix_hidden: torch.Tensor | None, run: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The trunk's [B, T, H] over the batch's own columns: assembled when every row is kept,
        else `run()` (kept when inside `keeping`)."""
        stamp = (autocast_key(batch.input_ids.device), weights_version(modules))
        spans = _spans(batch)
        rows = [self._rows.get(key) for key, _, _ in spans] if stamp == self._stamp else [None]
        if self._met is not None:
            self._met.update(key for key, _, _ in spans)
        if all(row is not None for row in rows):
            self.hits += 1
            return self._assemble(batch, spans, rows)
        self.misses += 1
        hidden = run()
        if self._met is not None:
            if stamp != self._stamp:
                self._rows, self._stamp = {}, stamp
            prefix = None if prefix_hidden is None else prefix_hidden[0]
            for i, (key, first, n) in enumerate(spans):
                self._rows[key] = _Row(prefix, hidden[i, first:first + n].clone())
        return hidden

    @staticmethod
    def _assemble(batch: PackedBatch, spans: list[tuple[Key, int, int]],
                  rows: list) -> torch.Tensor:
        cut = 0 if batch.prefix_ids is None else batch.prefix_ids.shape[1]
        own = rows[0].own
        out = own.new_zeros(len(rows), batch.input_ids.shape[1], own.shape[-1])
        for i, ((key, first, n), row) in enumerate(zip(spans, rows)):
            out[i, first:first + n] = row.columns(cut, len(key))
        return out

    @property
    def nbytes(self) -> int:
        """Bytes held by the kept rows (each shared prefix counted once)."""
        prefixes = {id(r.prefix): r.prefix for r in self._rows.values() if r.prefix is not None}
        tensors = [r.own for r in self._rows.values()] + list(prefixes.values())
        return sum(t.numel() * t.element_size() for t in tensors)
