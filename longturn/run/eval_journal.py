"""The journal of an evaluation: episodes are appended as they finish, so a stage that dies (a full
or read-only disk, a kill, out of memory) leaves every finished episode readable, and its rerun
plays only the rest (docs/operations.md, "Evaluations resume").

Under `<out>/partial/`:

    key.json                      what the episodes were played with (longturn/run/eval_key.py)
    part-NNNNN.turns.parquet      the samples (docs/design.md §4) of some episodes
    part-NNNNN.episodes.parquet   their episode rows; written last, so a part without it is none

Each file is written under a temp name, flushed to the disk and renamed into place. A journal
kept under another key is discarded, and an unreadable part (a torn copy) dropped, with one log
line each. The final outputs are always assembled from the journal, so a resumed evaluation writes
the same files as an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from longturn.atomic import fsync_file, named_disk_errors, write_json
from longturn.trajectories import EPISODE_SCHEMA, rows_table, write_arrow

log = logging.getLogger(__name__)

PARTIAL = "partial"
KEY = "key.json"
_PART = re.compile(r"part-(\d+)\.(turns|episodes)\.parquet$")


class EvalJournal:
    """Finished episodes of one evaluation, on disk under `<out>/partial/` and in memory."""

    def __init__(self, directory: Path, turn_schema: pa.Schema, metadata: dict[bytes, bytes],
                 flush_every: int):
        self.dir, self.turn_schema, self.metadata = directory, turn_schema, metadata
        self.flush_every = max(1, flush_every)
        self.finished: dict[str, dict[str, Any]] = {}  # episode id → episode row, as stored
        self.turn_tables: list[pa.Table] = []
        self.pending: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        self.next_part = 0

    @classmethod
    def open(cls, out: str | Path, key: dict[str, str], turn_schema: pa.Schema,
             metadata: dict[bytes, bytes], flush_every: int = 1) -> "EvalJournal":
        """The journal under `out`: kept when its key is `key`, else discarded and started anew."""
        journal = cls(Path(out) / PARTIAL, turn_schema, metadata, flush_every)
        with named_disk_errors(journal.dir):
            journal._keep_only(key)
            journal._load()
        if journal.finished:
            log.info("evaluation journal %s: %d finished episodes kept, not played again",
                     journal.dir, len(journal.finished))
        return journal

    def _keep_only(self, key: dict[str, str]) -> None:
        try:
            stored = json.loads((self.dir / KEY).read_text())
        except (OSError, ValueError):
            stored = None
        if self.dir.exists() and stored != key:
            parts = len(list(self.dir.glob("part-*.episodes.parquet")))
            if parts:
                other = [name for name in key if (stored or {}).get(name) != key[name]]
                log.warning("evaluation journal %s discarded (%d parts): played with other %s",
                            self.dir, parts, ", ".join(other))
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob(".*.tmp-*"):  # temp files of a killed write
            stale.unlink(missing_ok=True)
        if stored != key:
            write_json(self.dir / KEY, key)
            fsync_file(self.dir / KEY)

    def _load(self) -> None:
        parts: dict[int, set[str]] = {}
        for path in self.dir.iterdir():
            match = _PART.fullmatch(path.name)
            if match:
                parts.setdefault(int(match.group(1)), set()).add(match.group(2))
        for index in sorted(parts):
            self.next_part = index + 1
            if "episodes" not in parts[index]:  # killed between its two files: never finished
                self._path(index, "turns").unlink(missing_ok=True)
                continue
            try:
                episodes, turns = self._read(index)
            except (pa.ArrowException, OSError, ValueError) as err:
                first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                log.warning("evaluation journal part %s dropped, its episodes are played again: "
                            "unreadable (%s)", self._path(index, "episodes"), first)
                self._path(index, "turns").unlink(missing_ok=True)
                self._path(index, "episodes").unlink(missing_ok=True)
                continue
            self._keep(episodes, turns)

    def _read(self, index: int) -> tuple[list[dict[str, Any]], pa.Table]:
        episodes = pq.read_table(self._path(index, "episodes"))
        turns = pq.read_table(self._path(index, "turns"))
        for table, schema in ((episodes, EPISODE_SCHEMA), (turns, self.turn_schema)):
            if not table.schema.remove_metadata().equals(schema):
                raise ValueError("not the schema of this evaluation's rows")
        return episodes.to_pylist(), turns.replace_schema_metadata(None)

    def _keep(self, episodes: list[dict[str, Any]], turns: pa.Table) -> None:
        """Add a part's episodes; an episode already kept (never expected) is kept once."""
        new = [e for e in episodes if e["episode_id"] not in self.finished]
        if len(new) < len(episodes):
            ids = pa.array([e["episode_id"] for e in new], pa.string())
            turns = turns.filter(pc.is_in(turns["episode_id"], value_set=ids))
        self.finished.update((e["episode_id"], e) for e in new)
        self.turn_tables.append(turns)

    def _path(self, index: int, kind: str) -> Path:
        return self.dir / f"part-{index:05d}.{kind}.parquet"

    def add(self, episode: dict[str, Any], turns: list[dict[str, Any]]) -> None:
        """A finished episode and its samples; written once `flush_every` are waiting."""
        self.pending.append((episode, turns))
        if len(self.pending) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write the waiting episodes as the next part: samples first, episode rows last."""
        if not self.pending:
            return
        turns = rows_table([t for _, rows in self.pending for t in rows], self.turn_schema)
        episodes = rows_table([e for e, _ in self.pending], EPISODE_SCHEMA)
        write_arrow(turns, self._path(self.next_part, "turns"), self.metadata, durable=True)
        write_arrow(episodes, self._path(self.next_part, "episodes"), self.metadata,
                    durable=True)
        self.pending, self.next_part = [], self.next_part + 1
        self._keep(episodes.to_pylist(), turns)

    def episodes(self, order: list[str]) -> list[dict[str, Any]]:
        """The finished episodes' rows in this order of episode ids (ids not finished skipped)."""
        return [self.finished[i] for i in order if i in self.finished]

    def turns(self) -> pa.Table:
        """Every finished episode's samples, part after part."""
        return pa.concat_tables(self.turn_tables) if self.turn_tables \
            else self.turn_schema.empty_table()

    def remove(self) -> None:
        """Drop the journal once the final outputs are written (a failure here costs nothing: a
        rerun would only assemble the same outputs again)."""
        shutil.rmtree(self.dir, ignore_errors=True)
