"""The reward of an episode played by the user's own code (an agent, a slime generate function):
the number it gave, else the task's own reward of the conversation it left.

Why one place: that code and the task's reward run on input this project did not write, so a
reward that is not a finite number, or a task reward that fails on the messages, must abort that
one episode (`agent_error`), never the rollout, and say so the same way for both.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

from longturn.rollout.conversation import AGENT_ERROR

log = logging.getLogger(__name__)

Outcome = tuple[float | None, str | None]  # (reward, why the episode was aborted)
RewardFn = Callable[[dict[str, Any], list[dict[str, Any]]], float]


def given_reward(value: Any, who: str) -> Outcome:
    """`value` as a reward: None stays None (the task decides), a finite number is the reward,
    anything else aborts the episode."""
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        log.warning("%s gave the reward %r, not a finite number or None: episode aborted",
                    who, value)
        return None, AGENT_ERROR
    return float(value), None


def task_reward(reward_fn: RewardFn | None, task: dict[str, Any],
                messages: list[dict[str, Any]]) -> Outcome:
    """The task's own reward of `messages`; a reward function that fails on them aborts."""
    if reward_fn is None:
        return 0.0, None
    try:
        return float(reward_fn(task, messages)), None
    except Exception as err:  # the task's code on messages it did not write
        log.warning("the task's reward failed on the conversation of task %s seed %s, episode "
                    "aborted: %s: %s", task.get("task"), task.get("seed"), type(err).__name__,
                    err)
        return None, AGENT_ERROR
