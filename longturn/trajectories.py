"""The Parquet contract (docs/design.md §4): one row per sample, written atomically.

A sample is what the model saw (prompt_ids) and what it replied (response_ids, one or more
replies): a window-N turn is a sample with one reply, a whole episode one sample holding all its
replies. Column names are a contract: add columns freely, never rename. Training-only columns
(values, advantages, …) are null in evaluation files. Reading goes through `read_table`, so a
damaged file or a missing column is an error naming the file and the column, not Arrow's schema
dump. Files of schema version 1 (a row per turn, or a row per episode) are refused by name.
"""

from __future__ import annotations

import difflib
import json
import subprocess
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from longturn.atomic import atomic_file, fsync_file, named_disk_errors
from longturn.errors import TrajectoryFileError

SCHEMA_VERSION = "2"  # one sample schema: SAMPLE_SCHEMA
V1_SCHEMA_VERSION = "1"  # a row per turn, or a whole conversation per row: no longer read

_i32_list = pa.list_(pa.int32())
_f32_list = pa.list_(pa.float32())

REPLY_TYPE = pa.struct(
    [
        ("start", pa.int32()),
        ("end", pa.int32()),
        ("turn", pa.int32()),  # the reply's index in its episode
        ("step", pa.int32()),  # the lock-step of the batch
        ("response_text", pa.string()),
        ("raw_action", pa.string()),
        ("action", pa.string()),
        ("action_valid", pa.bool_()),
        ("action_failure", pa.string()),
        ("env_reward", pa.float32()),
        ("reward", pa.float32()),  # credited on the reply's last token
        ("terminated", pa.bool_()),
        ("truncated", pa.bool_()),
        ("success", pa.bool_()),
        ("aborted", pa.bool_()),  # the env failed: the reply's tokens are out of every loss
        ("segment_end", pa.bool_()),
        ("termination", pa.string()),
        ("finish_reason", pa.string()),
        ("history_dropped", pa.int32()),
        ("next_value", pa.float32()),
        ("logprob_gap", pa.float32()),
        ("observation", pa.string()),  # the state the reply acted on (GiGPO's anchor)
    ]
)

# Schema version 2 (docs/design.md §4): one row per sample; every per-token list is as long as
# response_ids, 0 on its context tokens (loss_mask 0).
SAMPLE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("policy_version", pa.string()),
        ("iteration", pa.int32()),
        ("env_index", pa.int32()),
        ("env_name", pa.string()),
        ("task", pa.string()),
        ("episode_id", pa.string()),
        ("episode_seed", pa.int64()),
        ("group_id", pa.string()),
        ("prompt_ids", _i32_list),
        ("response_ids", _i32_list),
        ("loss_mask", pa.list_(pa.int8())),  # 1: a token the model sampled (inside a reply)
        ("prompt_text", pa.string()),
        ("engine_logprobs", _f32_list),
        ("old_logprobs", _f32_list),
        ("ref_logprobs", _f32_list),
        ("values", _f32_list),
        ("token_rewards", _f32_list),
        ("advantages", _f32_list),
        ("returns", _f32_list),
        ("bootstrap_prompt_ids", _i32_list),
        ("images", pa.list_(pa.binary())),
        ("image_starts", _i32_list),  # positions into prompt_ids + response_ids
        ("messages", pa.string()),
        ("metrics", pa.string()),
        ("tokenization_check", pa.string()),
        ("tool_calls", pa.int32()),
        ("tool_errors", pa.int32()),
        ("user_turns", pa.int32()),
        ("assistant_turns", pa.int32()),
        ("replies", pa.list_(REPLY_TYPE)),
        # the frames of bootstrap_prompt_ids (a history window cut short) and where each one's
        # placeholders begin in it
        ("bootstrap_images", pa.list_(pa.binary())),
        ("bootstrap_image_starts", _i32_list),
    ]
)

EPISODE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("policy_version", pa.string()),
        ("env_name", pa.string()),
        ("task", pa.string()),
        ("episode_id", pa.string()),
        ("episode_seed", pa.int64()),
        ("success", pa.bool_()),
        ("return", pa.float64()),
        ("env_return", pa.float64()),
        ("length", pa.int32()),
        ("valid_actions", pa.int32()),
        ("valid_action_ratio", pa.float64()),
        ("terminated", pa.bool_()),
        ("truncated", pa.bool_()),
        ("aborted", pa.bool_()),
        ("termination", pa.string()),
    ]
)


def git_commit() -> str:
    """The commit of the working tree, or 'unknown' outside git."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).parent,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def file_metadata(extra: dict[str, Any] | None = None,
                  version: str = SCHEMA_VERSION) -> dict[bytes, bytes]:
    """Parquet key-value metadata: schema version, git commit, plus caller's keys (JSON values)."""
    meta = {"longturn.schema_version": version, "longturn.git_commit": git_commit()}
    for key, value in (extra or {}).items():
        meta[f"longturn.{key}"] = value if isinstance(value, str) else json.dumps(value)
    return {k.encode(): v.encode() for k, v in meta.items()}


def rows_table(rows: Iterable[dict[str, Any]], schema: pa.Schema | None) -> pa.Table:
    """Rows as an Arrow table: with a schema, missing keys are nulls and extra keys dropped."""
    rows = list(rows)
    if schema is None:
        return pa.Table.from_pylist(rows)
    return pa.table({name: [r.get(name) for r in rows] for name in schema.names}, schema=schema)


def write_arrow(table: pa.Table, path: str | Path, metadata: dict[bytes, bytes],
                durable: bool = False) -> Path:
    """A table to Parquet atomically with this file metadata (`file_metadata`); `durable`:
    flushed to the disk before the rename, so a power cut cannot leave a named empty file."""
    table = table.replace_schema_metadata(metadata)
    with atomic_file(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
        if durable:
            fsync_file(tmp)
    if durable:
        with named_disk_errors(path):
            fsync_file(Path(path).parent)
    return Path(path)


def write_episodes(rows: Iterable[dict[str, Any]], path: str | Path,
                   metadata: dict[str, Any] | None = None) -> Path:
    return write_arrow(rows_table(rows, EPISODE_SCHEMA), path, file_metadata(metadata))


def write_samples(rows: Iterable[dict[str, Any]], path: str | Path,
                  metadata: dict[str, Any] | None = None) -> Path:
    """Samples (schema version 2): missing keys are nulls, each reply a dict of REPLY_TYPE's
    fields. A sample whose replies do not tile its loss tokens is refused here (`check_replies`)."""
    rows = list(rows)
    for i, row in enumerate(rows):
        check_replies(row, i)
    return write_arrow(rows_table(rows, SAMPLE_SCHEMA), path, file_metadata(metadata))


def check_replies(sample: dict[str, Any], index: int = 0) -> None:
    """The replies, in order, are disjoint spans of response_ids starting at 0, and the loss
    tokens are exactly their union.

    The writer checks this, not the readers: a broken sample is a bug of the code that built it,
    caught where its traceback still points at that code and before any file exists; every v2 file
    then keeps the rule, so the batch reader, scoring, the audit and a DuckDB query can all trust
    `replies` to say which tokens are trained without each checking it again.
    """
    response, mask, replies = (sample.get(k) for k in ("response_ids", "loss_mask", "replies"))
    if response is None and mask is None and replies is None:
        return
    where = f"sample {index} (episode {sample.get('episode_id')})"
    if response is None or mask is None or replies is None:
        raise ValueError(f"{where}: response_ids, loss_mask and replies go together")
    if len(mask) != len(response):
        raise ValueError(f"{where}: {len(mask)} loss_mask entries for {len(response)} "
                         "response tokens")
    cover = np.zeros(len(response), dtype=bool)
    prev = 0
    for k, reply in enumerate(replies):
        start, end = reply.get("start"), reply.get("end")
        if start is None or end is None or not prev <= start <= end <= len(response) or (
                k == 0 and start != 0):
            raise ValueError(f"{where}: reply {k} spans [{start}, {end}) after {prev}, out of "
                             f"order or outside its {len(response)} response tokens (the first "
                             "reply starts at 0)")
        cover[start:end] = True
        prev = end
    loss = np.asarray(mask, dtype=np.int8) != 0
    if (loss != cover).any():
        at = int(np.flatnonzero(loss != cover)[0])
        raise ValueError(f"{where}: replies do not tile its loss tokens: response token {at} has "
                         f"loss_mask {int(loss[at])} but is {'in' if cover[at] else 'outside'} a "
                         "reply")


def require_samples(path: str | Path) -> None:
    """Refuse a file that is not schema version 2: its columns would be read wrong."""
    version = read_metadata(path).get("schema_version")
    if version == SCHEMA_VERSION:
        return
    if version == V1_SCHEMA_VERSION:
        raise TrajectoryFileError(f"{path} was written by schema version 1 (before one sample "
                                  "schema): rerun the stage that wrote it")
    raise TrajectoryFileError(f"{path} has schema version {version or 'none'}, not "
                              f"{SCHEMA_VERSION} (docs/design.md §4): rerun the stage that wrote it")


def read_schema(path: str | Path) -> pa.Schema:
    """The schema of a Parquet file; a missing or damaged file names itself."""
    path = Path(path)
    if not path.is_file():
        raise TrajectoryFileError(f"{path} does not exist")
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as err:
        raise TrajectoryFileError(f"{path} is not a readable Parquet file (truncated or "
                                  f"damaged?): {_first_line(err)}") from None


def read_table(path: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    """These columns (all without) of a Parquet file; a missing column is named, with the
    file's closest column outside the contract when it looks renamed."""
    names = read_schema(path).names
    contract = set(SAMPLE_SCHEMA.names) | set(EPISODE_SCHEMA.names)
    for column in columns or ():
        if column not in names:
            strangers = [n for n in names if n not in contract]
            close = difflib.get_close_matches(column, strangers, n=1)
            hint = f" (it has {close[0]!r}: renamed?)" if close else ""
            raise TrajectoryFileError(f"{path} has no column {column!r}{hint}; column names are "
                                      "a contract: docs/design.md §4")
    try:
        return pq.read_table(path, columns=list(columns) if columns is not None else None)
    except (pa.ArrowException, OSError) as err:
        raise TrajectoryFileError(f"{path} cannot be read (truncated or damaged?): "
                                  f"{_first_line(err)}") from None


def _first_line(err: BaseException) -> str:
    """Arrow's messages go on with the whole schema: its first line is the point."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def read_metadata(path: str | Path) -> dict[str, str]:
    """The longturn.* key-value metadata of a Parquet file, keys without the prefix."""
    raw = read_schema(path).metadata or {}
    return {key.decode().removeprefix("longturn."): value.decode()
            for key, value in raw.items() if key.startswith(b"longturn.")}
