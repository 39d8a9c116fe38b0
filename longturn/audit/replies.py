"""The audit's one reading path: a run's samples (schema v2, docs/design.md §4) as one row per
reply, each per-token list cut to the reply's [start:end] (docs/audit.md), so a window sample (one
reply) and a packed whole episode (all of them) read alike. Context tokens inside a packed
response (tool results, the template's closings) belong to no reply; `diff` reads whole samples
for them."""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from longturn.audit.run_files import Run, read_file, require_columns
from longturn.trajectories import REPLY_TYPE

REPLY_FIELDS = tuple(field.name for field in REPLY_TYPE)
# per-token lists as long as response_ids: a reply row holds its own [start:end]
TOKEN_LISTS = ("response_ids", "loss_mask", "engine_logprobs", "old_logprobs", "ref_logprobs",
               "values", "token_rewards", "advantages", "returns")
# added to every reply row: the file's rank, the sample's number in this read, the reply's in it
KEYS = ("rank", "sample", "reply")


def slice_lists(lists: pa.ListArray, parents: np.ndarray, starts: np.ndarray,
                ends: np.ndarray) -> pa.ListArray:
    """Entry i: lists[parents[i]][starts[i]:ends[i]] (null where that list is null), gathered in
    one take instead of a Python loop over tokens."""
    lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False)
    valid = lists.is_valid().to_numpy(zero_copy_only=False)[parents]
    row_length = lengths[parents]
    lo = np.minimum(starts, row_length)
    hi = np.clip(ends, lo, row_length)
    sizes = np.where(valid, hi - lo, 0)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    row_base = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    gather = (np.repeat(row_base[parents] + lo - offsets[:-1], sizes)
              + np.arange(offsets[-1], dtype=np.int64))
    values = lists.flatten().take(pa.array(gather, type=pa.int64()))
    return pa.LargeListArray.from_arrays(pa.array(offsets, type=pa.int64()), values,
                                         mask=pa.array(~valid))


def explode(table: pa.Table, fields: Iterable[str]) -> pa.Table:
    """One row per reply of `table` (which holds `replies`): its other columns repeated, the
    asked reply `fields`, every per-token list cut to the reply, and `sample`/`reply` numbers."""
    replies = table.column("replies").combine_chunks()
    parents = pc.list_parent_indices(replies).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(replies)
    starts, ends = (flat.field(k).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
                    for k in ("start", "end"))
    first = np.searchsorted(parents, parents, side="left")  # parents ascend: a row's first reply
    columns: dict[str, pa.Array] = {}
    for name in table.column_names:
        if name == "replies":
            continue
        column = table.column(name).combine_chunks()
        columns[name] = (slice_lists(column, parents, starts, ends) if name in TOKEN_LISTS
                         else column.take(pa.array(parents)))
    for name in fields:
        columns[name] = flat.field(name)
    columns["sample"] = pa.array(parents)
    columns["reply"] = pa.array(np.arange(len(parents), dtype=np.int64) - first)
    return pa.table(columns)


def read_replies(run: Run, columns: Iterable[str], filters: list | None = None) -> pd.DataFrame:
    """The replies of every file as one frame: the asked columns (row columns, reply fields and
    per-token lists, cut to the reply) plus KEYS. `filters` (pyarrow's) apply to row columns."""
    columns = list(dict.fromkeys(columns))
    rows = [c for c in columns if c not in REPLY_FIELDS]
    fields = [c for c in columns if c in REPLY_FIELDS]
    required = ["replies", *(f"replies.{c}" if c in REPLY_FIELDS else c for c in columns)]
    frames, samples = [], 0
    for sample_file in run.files:
        require_columns(sample_file.path, required)
        table = read_file(sample_file.path, [*rows, "replies"], filters)
        frame = explode(table, fields).to_pandas()
        frame["sample"] += samples
        frame["rank"] = sample_file.rank
        samples += table.num_rows
        frames.append(frame)
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    for column in [*columns, *KEYS]:
        if column not in frame.columns:
            frame[column] = None
    return frame
