"""What an env says about its task, which the agent's prompt builder turns into a system prompt.

Why a module of its own: envs declare it and agent/ reads it, and neither should import the other
for a plain record.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Instructions:
    """Episode-level instructions the prompt builder turns into a system prompt."""

    goal: str
    actions: dict[str, str]  # action name -> short description, in display order
    tips: list[str] = field(default_factory=list)
    # worked exchanges (goal, observation text, ideal reply) that small models imitate; shown in
    # order before the history, so they sit in the prompt prefix every turn shares
    demonstrations: tuple[tuple[str, str, str], ...] = ()
