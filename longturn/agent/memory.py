"""The past turns an action prompt may show again (Verlog keeps one)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class HistoryEntry:
    """One past turn as the model will see it again."""

    observation: str
    reply: str  # the model's output, or the executed action rendered as a reply


@dataclass(frozen=True)
class PastTurn:
    """One past env step as it happened: the observation the reply answered, the reply, the
    action it ran and whether the reply named that action. How it is shown again is the
    prompt's choice (`ActionPrompt`: the reply, or only the action)."""

    observation: str
    reply: str
    action: str
    valid: bool


class HistoryWindow:
    """The last `size` turns of the current episode (None: all of them, `rollout.context:
    episode`); cleared when an episode ends."""

    def __init__(self, size: int | None):
        if size is not None and size < 0:
            raise ValueError(f"history size must be >= 0, got {size}")
        self.size = size
        self._turns: deque[PastTurn] = deque(maxlen=size or None)

    def __setstate__(self, state: dict) -> None:
        """A checkpoint resumes across an upgrade: a window pickled when it kept the rendered
        reply (`HistoryEntry`) keeps it, as the reply of a valid turn of that action."""
        self.__dict__.update(state)
        self._turns = deque((PastTurn(t.observation, t.reply, t.reply.removeprefix("ACTION: "),
                                      True) if isinstance(t, HistoryEntry) else t
                             for t in self._turns), maxlen=self._turns.maxlen)

    def clear(self) -> None:
        self._turns.clear()

    def add(self, turn: PastTurn) -> None:
        if self.size != 0:
            self._turns.append(turn)

    def entries(self) -> list[PastTurn]:
        """Oldest first."""
        return list(self._turns)
