"""Find a run dir's sample files (schema v2, docs/design.md §4), turning every unreadable input
into one named line.

A run dir is a train output, its `trajectories/` folder, one `iteration=NNNN` folder, an
evaluation output (or, before it has finished, its journal `partial/`), prompt validation's
output, or a single Parquet file. Footers, schema versions and columns are checked before anything
is computed, so a truncated, version 1 or foreign file is named instead of raising a pyarrow
traceback or giving a wrong number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from longturn.errors import TrajectoryFileError, UserError
from longturn.trajectories import require_samples

_PART = re.compile(r"part-(\d+)\.parquet$")
_ITERATION = re.compile(r"iteration=(\d+)$")


class RunDirError(UserError):
    """The run dir is missing or holds no sample files."""


@dataclass(frozen=True)
class SampleFile:
    """One sample Parquet file and where it sits in the run."""

    path: Path
    rank: int  # from part-RR.parquet; 0 for an evaluation's turns.parquet


@dataclass(frozen=True)
class Run:
    """The sample files of one run dir, in (iteration dir, rank) order."""

    root: Path
    kind: str  # "train" or "eval"
    files: tuple[SampleFile, ...]
    episodes_file: Path | None = None  # an evaluation's episodes.parquet, when present


def _rank(path: Path) -> int:
    match = _PART.search(path.name)
    return int(match.group(1)) if match else 0


def _journal_parts(root: Path) -> list[Path]:
    """The sample files of an evaluation that has not finished (its journal, `partial/`, or the
    journal dir itself): parts whose episode file is written, the ones a rerun keeps."""
    journal = root / "partial" if (root / "partial").is_dir() else root
    return [p for p in sorted(journal.glob("part-*.turns.parquet"))
            if p.with_name(p.name.replace(".turns.", ".episodes.")).is_file()]


def open_run(path: str | Path) -> Run:
    """The run at `path`; raises RunDirError naming the path when it holds no sample files."""
    root = Path(path)
    if not root.exists():
        raise RunDirError(f"{root}: no such file or directory")
    if root.is_file():
        if root.suffix != ".parquet":
            raise RunDirError(f"{root}: not a Parquet file or run directory")
        kind = "train" if _PART.search(root.name) else "eval"
        return Run(root, kind, (SampleFile(root, _rank(root)),))
    if (root / "turns.parquet").is_file():
        episodes = root / "episodes.parquet"
        return Run(root, "eval", (SampleFile(root / "turns.parquet", 0),),
                   episodes if episodes.is_file() else None)
    if (root / "samples.parquet").is_file():  # a validation's first turns or episodes
        return Run(root, "eval", (SampleFile(root / "samples.parquet", 0),))
    journaled = _journal_parts(root)
    if journaled:
        return Run(root, "eval", tuple(SampleFile(p, 0) for p in journaled))
    folder = root / "trajectories" if (root / "trajectories").is_dir() else root
    parts = sorted(folder.glob("part-*.parquet" if _ITERATION.search(folder.name)
                               else "iteration=*/part-*.parquet"))
    if not parts:
        raise RunDirError(f"{root}: no sample Parquet files (expected "
                          "trajectories/iteration=NNNN/part-RR.parquet, turns.parquet or "
                          "samples.parquet)")
    return Run(root, "train", tuple(SampleFile(p, _rank(p)) for p in parts))


def _first_sentence(err: Exception) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text.split(". ")[0].rstrip(".")


def schema_of(path: Path) -> pa.Schema:
    """The file's schema, read from its footer; a truncated or non-Parquet file is named."""
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as err:
        raise TrajectoryFileError(f"{path}: not a readable Parquet file (truncated or not "
                                  f"Parquet): {_first_sentence(err)}") from None


def require_version(path: Path) -> pa.Schema:
    """The schema of a readable file of schema version 2; one of version 1 is one line saying to
    rerun the stage that wrote it."""
    schema = schema_of(path)  # a truncated file is named as such, not as one without a version
    require_samples(path)
    return schema


def require_columns(path: Path, columns: Iterable[str]) -> None:
    """require_version, then every column of `columns`; a name `replies.FIELD` is a field of
    the replies struct."""
    schema = require_version(path)
    for column in columns:
        name, _, field = column.partition(".")
        if name not in schema.names or (field and field not in _struct_fields(schema, name)):
            raise TrajectoryFileError(f"{path}: column '{column}' is missing (not a longturn "
                                      "sample file, or written by another program)")


def _struct_fields(schema: pa.Schema, name: str) -> set[str]:
    """The field names of a list<struct> column (none for any other type)."""
    kind = schema.field(name).type
    if pa.types.is_list(kind) and pa.types.is_struct(kind.value_type):
        return {f.name for f in kind.value_type}
    return set()


def read_file(path: Path, columns: list[str], filters: list | None = None) -> pa.Table:
    """Read columns of one file; damaged data pages are named like a damaged footer."""
    try:
        return pq.read_table(path, columns=columns, filters=filters)
    except (pa.ArrowException, OSError) as err:
        raise TrajectoryFileError(f"{path}: unreadable Parquet data: {_first_sentence(err)}") from None
