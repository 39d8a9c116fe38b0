"""Tensors for PPO from samples: tempered logprobs, padding, and the per-rank training batch.

The trainer reads ONLY the Parquet file (docs/design.md §3: the file is the hand-off), so this
module turns its list columns back into right-padded [B, R] tensors, micro-batch by micro-batch.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from longturn.algo.gae import masked_whiten
from longturn.errors import TrajectoryFileError
from longturn.trajectories import read_table, require_samples
from longturn.vision.frames import from_png

_FLOAT_LISTS = ("old_logprobs", "ref_logprobs", "values", "advantages", "returns")


def autocast(enabled: bool, device: torch.device | str = "cpu") -> AbstractContextManager:
    """bf16 autocast for forward/backward (weights stay fp32), or nothing."""
    if not enabled:
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def pad_rows(rows: Sequence[Sequence[float]] | Sequence[np.ndarray], width: int | None = None,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Right-pad variable-length rows with 0 into a [B, width] tensor."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row):
            out[i, : len(row)] = torch.tensor(np.asarray(row), dtype=dtype)
    return out


@dataclass
class MicroBatch:
    """Padded training tensors of a few turns (R = longest response among them)."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor  # whitened
    returns: torch.Tensor
    mask: torch.Tensor  # bool: real response token of a non-aborted turn
    images: list[list[tuple[int, np.ndarray]]] | None = None  # per row: (start, frame)

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())

    def to(self, device: torch.device) -> MicroBatch:
        """The same micro-batch with its tensors on ``device``."""
        return replace(self, **{k: v.to(device) for k, v in vars(self).items()
                                if isinstance(v, torch.Tensor)})


@dataclass
class TurnBatch:
    """One rank's turns, as read from Parquet; float columns are per-row float32 arrays."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    columns: dict[str, list[np.ndarray]]
    aborted: np.ndarray
    whitened: list[np.ndarray]
    # per response token, True where the model sampled it (in a whole episode packed as one
    # sample, tool results and user turns inside the response are context, out of every loss and
    # statistic)
    token_mask: list[np.ndarray]
    has_values: bool = True  # False: a critic-free file, whose `values` column is all zeros here
    # conversations with image observations: per row, (placeholder start in prompt + response,
    # PNG bytes) of each frame; decoded per micro-batch
    images: list[list[tuple[int, bytes]]] | None = None

    def __len__(self) -> int:
        return len(self.response_ids)

    def loss_tokens(self, i: int) -> np.ndarray:
        """Row i's response tokens that count (all False for an aborted turn)."""
        if self.aborted[i]:
            return np.zeros(len(self.response_ids[i]), dtype=bool)
        return self.token_mask[i]

    def padded_to(self, n: int) -> "TurnBatch":
        """This batch with fully masked copies of its first row appended up to `n` rows: ranks
        must run the same micro-batch schedule (ZeRO reduces every micro-batch), but episodes
        that end when they end (whole episodes, a reply per sample of a window) give ranks
        different numbers of samples. The copies have no loss token: no gradient, no statistic."""
        extra = n - len(self)
        if extra <= 0:
            return self
        dead = np.zeros(len(self.response_ids[0]), dtype=np.float32)
        return TurnBatch(
            self.prompt_ids + [self.prompt_ids[0]] * extra,
            self.response_ids + [self.response_ids[0]] * extra,
            {k: rows + [rows[0]] * extra for k, rows in self.columns.items()},
            np.concatenate([self.aborted, np.ones(extra, dtype=bool)]),
            self.whitened + [dead] * extra, self.token_mask + [dead.astype(bool)] * extra,
            has_values=self.has_values,
            images=None if self.images is None else self.images + [self.images[0]] * extra)

    def select(self, index: Sequence[int]) -> MicroBatch:
        """The micro-batch of rows ``index`` as padded tensors."""
        index = list(index)
        width = max(len(self.response_ids[i]) for i in index)
        pad = {k: pad_rows([self.columns[k][i] for i in index], width)
               for k in ("old_logprobs", "ref_logprobs", "values", "returns")}
        return MicroBatch(
            prompt_ids=[self.prompt_ids[i] for i in index],
            response_ids=[self.response_ids[i] for i in index], **pad,
            advantages=pad_rows([self.whitened[i] for i in index], width),
            mask=pad_rows([self.loss_tokens(i) for i in index], width, torch.bool),
            images=None if self.images is None else
            [[(start, from_png(png)) for start, png in self.images[i]] for i in index],
        )

    def n_tokens(self, index: Sequence[int]) -> int:
        """Loss tokens (`loss_tokens`) among rows ``index``."""
        return int(sum(self.loss_tokens(i).sum() for i in index))

    def flat(self, name: str) -> np.ndarray:
        """A float column's loss tokens concatenated over rows."""
        rows = [r[self.loss_tokens(i)] for i, r in enumerate(self.columns[name])]
        return np.concatenate(rows) if rows else np.zeros(0, dtype=np.float32)


def _split_lists(column: pa.ChunkedArray, dtype: type) -> list[np.ndarray]:
    """A list<…> column as one numpy array per row (fast path over offsets, no Python floats)."""
    array = column.combine_chunks()
    offsets = array.offsets.to_numpy()
    values = array.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return np.split(values, offsets[1:-1] - offsets[0]) if len(array) else []


SAMPLE_TRAIN_COLUMNS = ("prompt_ids", "response_ids", "loss_mask", "replies", "old_logprobs",
                        "ref_logprobs", "values", "advantages", "returns")


def read_sample_batch(paths: Sequence[str | Path], whiten: bool = True,
                      values: bool = True) -> TurnBatch:
    """Samples (schema v2, docs/design.md §4) as a TurnBatch, window-N turns and whole episodes
    alike: a row's token mask is its loss mask without the tokens of aborted replies (an env that
    failed must not train them). A sample with no loss token left (an aborted turn, an episode with
    no reply) stays as a row, marked aborted: every rank then holds one row per sample it played,
    as the distributed update needs. Whitening runs over the loss tokens of the batch.
    `values=False` (a critic-free estimator) neither reads nor requires the values column."""
    if not paths:
        raise ValueError("update needs at least one Parquet file")
    for path in paths:
        require_samples(path)
    wanted = [c for c in SAMPLE_TRAIN_COLUMNS if values or c != "values"]
    tables = [read_table(p, [*wanted, "images", "image_starts"]) for p in paths]
    for path, part in zip(paths, tables):
        for name in wanted:  # an evaluation file, or rows never scored, has nulls
            if part.column(name).null_count:
                raise TrajectoryFileError(
                    f"{path}: column {name!r} has nulls: not a scored training file (evaluation "
                    "files leave the training columns empty)")
    table = pa.concat_tables(tables)
    prompts = [list(map(int, r)) for r in _split_lists(table.column("prompt_ids"), np.int64)]
    responses = [list(map(int, r)) for r in _split_lists(table.column("response_ids"), np.int64)]
    columns = {k: _split_lists(table.column(k), np.float32) for k in _FLOAT_LISTS
               if k in wanted}
    if not values:
        columns["values"] = [np.zeros(len(r), dtype=np.float32) for r in responses]
    for name, rows in columns.items():
        for i, (row, resp) in enumerate(zip(rows, responses)):
            if len(row) != len(resp) or not len(resp):
                raise ValueError(f"row {i}: {len(row)} {name} for {len(resp)} response tokens")
    masks = [m.copy() for m in _split_lists(table.column("loss_mask"), bool)]
    for i, start, end in _aborted_replies(table.column("replies")):
        masks[i][start:end] = False
    aborted = np.array([not m.any() for m in masks], dtype=bool)
    if aborted.all():
        raise ValueError("no sample of the batch has a loss token (every one aborted or without "
                         "a reply): nothing to train on")
    frames = zip(table.column("image_starts").to_pylist(), table.column("images").to_pylist())
    images = [list(zip(starts or [], pngs or [])) for starts, pngs in frames]
    whitened = _whiten(columns["advantages"], masks, whiten)
    return TurnBatch(prompts, responses, columns, aborted, whitened, masks, has_values=values,
                     images=images if any(images) else None)


def _aborted_replies(column: pa.ChunkedArray) -> list[tuple[int, int, int]]:
    """(row, start, end) of every reply marked aborted."""
    array = column.combine_chunks()
    flat = array.flatten()
    row_of = np.repeat(np.arange(len(array)), np.diff(array.offsets.to_numpy()))
    aborted = pc.struct_field(flat, "aborted").fill_null(False).to_numpy(zero_copy_only=False)
    starts = pc.struct_field(flat, "start").to_numpy(zero_copy_only=False)
    ends = pc.struct_field(flat, "end").to_numpy(zero_copy_only=False)
    return [(int(row_of[k]), int(starts[k]), int(ends[k])) for k in np.flatnonzero(aborted)]


def _whiten(advantages: list[np.ndarray], masks: list[np.ndarray], whiten: bool
            ) -> list[np.ndarray]:
    """Per-row advantages whitened over every loss token of the batch (or copies when off)."""
    if not whiten:
        return [a.copy() for a in advantages]
    white = masked_whiten(np.concatenate(advantages).astype(np.float64), np.concatenate(masks))
    return np.split(white.numpy().astype(np.float32), np.cumsum([len(a) for a in advantages])[:-1])
