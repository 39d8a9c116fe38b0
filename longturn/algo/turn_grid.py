"""Turns as a dense grid of lock-steps × slots: the one answer to "which turn comes next
in this episode".

The collector steps every slot in lock-step, so a batch is a [steps, slots] grid (the layout of
ikostrikov's RolloutStorage), with a hole where a slot had no turn (a group collector's slot
whose episode has ended). Rows arrive in any order (a Parquet file, several ranks' parts); the
grid puts them back by (iteration, step) and env_index. Scoring asks it for each turn's successor
(whose first value is the turn's next_value) and GAE for the order of its backward sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class TurnGrid:
    """`cells[t, e]`: the row of lock-step t (iterations one after another) in slot e, or -1."""

    cells: np.ndarray  # int64 [T, E]
    slots: np.ndarray  # env_index of each column
    next_row: np.ndarray  # int64 [n]: the next turn of the same episode and iteration, or -1

    @classmethod
    def build(cls, env_index: Sequence[int], step: Sequence[int], episode_id: Sequence[Any],
              iteration: Sequence[int] | None = None) -> "TurnGrid":
        """The grid of these rows; two rows in the same cell are refused (ambiguous order)."""
        env = np.asarray(env_index, dtype=np.int64)
        stp = np.asarray(step, dtype=np.int64)
        it = np.zeros_like(env) if iteration is None else np.asarray(iteration, dtype=np.int64)
        slots, column = np.unique(env, return_inverse=True)
        times, time = np.unique(np.stack([it, stp], axis=1), axis=0, return_inverse=True)
        time = time.reshape(-1)
        cells = np.full((len(times), len(slots)), -1, dtype=np.int64)
        for row, (t, e) in enumerate(zip(time, column)):
            if cells[t, e] >= 0:
                raise ValueError(f"two turns share env_index={env[row]} step={stp[row]} "
                                 f"(rows {cells[t, e]} and {row}): their order is ambiguous")
            cells[t, e] = row
        episodes = np.asarray(list(episode_id), dtype=object)
        next_row = np.full(len(env), -1, dtype=np.int64)
        if len(times) > 1:
            now, later = cells[:-1], cells[1:]
            follows = (times[1:, 0] == times[:-1, 0]) & (times[1:, 1] == times[:-1, 1] + 1)
            linked = (now >= 0) & (later >= 0) & follows[:, None]
            rows, nexts = now[linked], later[linked]
            same = episodes[rows] == episodes[nexts]
            next_row[rows[same]] = nexts[same]
        return cls(cells, slots, next_row)

    def slot_major_order(self) -> np.ndarray:
        """Every row, slot by slot, in time order within a slot (GAE sweeps each slot backward)."""
        column_major = self.cells.T.reshape(-1)
        return column_major[column_major >= 0]
