"""The text-environment protocol every longturn env follows (gymnasium-style, strings in and out).

Envs describe the world and execute actions; they never format chat prompts (agent/ does that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from longturn.instructions import Instructions  # noqa: F401 (envs import it from here too)


@dataclass
class Observation:
    """What the agent perceives after a reset or a step."""

    text: str
    image: np.ndarray | None = None


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
