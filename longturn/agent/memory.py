"""The short history window each turn's prompt carries (Verlog keeps one past turn)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class HistoryEntry:
    """One past turn as the model will see it again."""

    observation: str
    reply: str  # the model's output, or the executed action rendered as a reply


class HistoryWindow:
    """The last `size` turns of the current episode (None: all of them, `rollout.context:
    episode`); cleared when an episode ends."""

    def __init__(self, size: int | None):
        if size is not None and size < 0:
            raise ValueError(f"history size must be >= 0, got {size}")
        self.size = size
        self._turns: deque[HistoryEntry] = deque(maxlen=size or None)

    def clear(self) -> None:
        self._turns.clear()

    def add(self, observation: str, reply: str) -> None:
        if self.size != 0:
            self._turns.append(HistoryEntry(observation, reply))

    def entries(self) -> list[HistoryEntry]:
        """Oldest first."""
        return list(self._turns)
