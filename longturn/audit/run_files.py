"""Find and read the turn files of a run dir, turning every unreadable input into one named line.

A run dir is a train output (`trajectories/iteration=NNNN/part-RR.parquet`), its `trajectories/`
folder, one `iteration=NNNN` folder, an evaluation output (`turns.parquet`, `episodes.parquet`;
before the evaluation has finished, the episodes in its journal `partial/`), or a single Parquet
file. Every file's footer and columns are checked before anything is computed, so
a truncated copy or a foreign file is reported by name instead of as a pyarrow traceback.
Sequence-mode files (one row per episode) sit at the same paths; audit/sequences.py reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from longturn.errors import TrajectoryFileError, UserError

_PART = re.compile(r"part-(\d+)\.parquet$")
_ITERATION = re.compile(r"iteration=(\d+)$")


class RunDirError(UserError):
    """The run dir is missing or holds no turn files."""


@dataclass(frozen=True)
class TurnFile:
    """One turn Parquet file and where it sits in the run."""

    path: Path
    rank: int  # from part-RR.parquet; 0 for an evaluation's turns.parquet


@dataclass(frozen=True)
class Run:
    """The turn files of one run dir, in (iteration dir, rank) order."""

    root: Path
    kind: str  # "train" or "eval"
    files: tuple[TurnFile, ...]
    episodes_file: Path | None = None  # an evaluation's episodes.parquet, when present


def _rank(path: Path) -> int:
    match = _PART.search(path.name)
    return int(match.group(1)) if match else 0


def _parts_under(folder: Path) -> list[Path]:
    if _ITERATION.search(folder.name):
        return sorted(folder.glob("part-*.parquet"))
    return sorted(folder.glob("iteration=*/part-*.parquet"))


def _journal_parts(root: Path) -> list[Path]:
    """The turn files of an evaluation that has not finished (its journal, `partial/`, or the
    journal dir itself): parts whose episode file is written, the ones a rerun keeps."""
    journal = root / "partial" if (root / "partial").is_dir() else root
    return [p for p in sorted(journal.glob("part-*.turns.parquet"))
            if p.with_name(p.name.replace(".turns.", ".episodes.")).is_file()]


def open_run(path: str | Path) -> Run:
    """The run at `path`; raises RunDirError naming the path when it holds no turn files."""
    root = Path(path)
    if not root.exists():
        raise RunDirError(f"{root}: no such file or directory")
    if root.is_file():
        if root.suffix != ".parquet":
            raise RunDirError(f"{root}: not a Parquet file or run directory")
        kind = "train" if _PART.search(root.name) else "eval"
        return Run(root, kind, (TurnFile(root, _rank(root)),))
    if (root / "turns.parquet").is_file():
        episodes = root / "episodes.parquet"
        return Run(root, "eval", (TurnFile(root / "turns.parquet", 0),),
                   episodes if episodes.is_file() else None)
    journaled = _journal_parts(root)
    if journaled:
        return Run(root, "eval", tuple(TurnFile(p, 0) for p in journaled))
    trajectories = root / "trajectories"
    parts = _parts_under(trajectories if trajectories.is_dir() else root)
    if not parts:
        raise RunDirError(f"{root}: no turn Parquet files (expected "
                          "trajectories/iteration=NNNN/part-RR.parquet or turns.parquet)")
    return Run(root, "train", tuple(TurnFile(p, _rank(p)) for p in parts))


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


def require_columns(path: Path, columns: Iterable[str]) -> pa.Schema:
    """The schema of `path` after checking that it has every column of `columns`."""
    schema = schema_of(path)
    for column in columns:
        if column not in schema.names:
            raise TrajectoryFileError(f"{path}: column '{column}' is missing (not a longturn "
                                      "turn file, or written by another program)")
    return schema


def check_run(run: Run, required: Iterable[str]) -> None:
    """Every turn file of the run readable and holding the required columns."""
    required = tuple(required)
    for turn_file in run.files:
        require_columns(turn_file.path, required)


def read_file(path: Path, columns: list[str], filters: list | None = None) -> pa.Table:
    """Read columns of one file; damaged data pages are named like a damaged footer."""
    try:
        return pq.read_table(path, columns=columns, filters=filters)
    except (pa.ArrowException, OSError) as err:
        raise TrajectoryFileError(f"{path}: unreadable Parquet data: {_first_sentence(err)}") from None


def read_turns(run: Run, required: Iterable[str], optional: Iterable[str] = (),
               filters: list | None = None) -> pd.DataFrame:
    """The turns of every file as one frame with a `rank` column (and the optional columns the
    files have), rows in file order."""
    required = list(dict.fromkeys(required))
    frames = []
    for turn_file in run.files:
        names = require_columns(turn_file.path, required).names
        columns = required + [c for c in optional if c in names and c not in required]
        frame = read_file(turn_file.path, columns, filters).to_pandas()
        frame["rank"] = turn_file.rank
        frames.append(frame)
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    for column in optional:
        if column not in frame.columns:
            frame[column] = None
    return frame
