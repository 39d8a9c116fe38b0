"""The text-environment protocol every longturn env follows (gymnasium-style, strings in and out).

Envs describe the world and execute actions; they never format chat prompts (agent/ does that).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass
class Observation:
    """What the agent perceives after a reset or a step."""

    text: str
    image: np.ndarray | None = None


@dataclass
class Instructions:
    """Episode-level instructions the prompt builder turns into a system prompt."""

    goal: str
    actions: dict[str, str]  # action name -> short description, in display order
    tips: list[str] = field(default_factory=list)
    # worked exchanges (goal, observation text, ideal reply) that small models imitate; shown in
    # order before the history, so they sit in the prompt prefix every turn shares
    demonstrations: tuple[tuple[str, str, str], ...] = ()


@runtime_checkable
class TextEnv(Protocol):
    """A text environment. `instructions` is valid after `reset` (the goal may change per episode)."""

    name: str
    task: str
    actions: list[str]
    default_action: str
    synonyms: dict[str, str]  # normalised alias -> canonical action name

    @property
    def instructions(self) -> Instructions: ...

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]: ...

    def close(self) -> None: ...
