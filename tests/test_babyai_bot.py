"""The upstream BabyAI bot, acting only through action names, solves every task kind: levels are solvable."""

from __future__ import annotations

import pytest
from minigrid.utils.baby_ai_bot import BabyAIBot

from longturn.envs.babyai import TASKS, BabyAITextEnv


def _solve(task: str, seed: int, num_dists: int) -> tuple[bool, int, int]:
    env = BabyAITextEnv(task, num_dists=num_dists)
    _, info = env.reset(seed=seed)
    bot = BabyAIBot(env.unwrapped)
    for _ in range(info["max_steps"]):
        action = env.actions[int(bot.replan())]  # bot's minigrid int -> our language action
        _, reward, terminated, truncated, step_info = env.step(action)
        if terminated or truncated:
            return step_info["success"] and reward > 0, env.unwrapped.step_count, info["max_steps"]
    return False, env.unwrapped.step_count, info["max_steps"]


@pytest.mark.parametrize("task", TASKS)
def test_bot_solves_every_task(task: str) -> None:
    failures = [seed for seed in range(20) if not _solve(task, seed, num_dists=0)[0]]
    assert failures == []


@pytest.mark.parametrize("task", TASKS)
def test_bot_solves_with_distractors(task: str) -> None:
    failures = [seed for seed in range(100, 105) if not _solve(task, seed, num_dists=3)[0]]
    assert failures == []
