"""The past turns an action prompt may show again (Verlog keeps a window of them)."""

from __future__ import annotations

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
