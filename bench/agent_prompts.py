"""Real agent prompts for benches, built exactly as the collector builds them.

Why: generation and training costs depend on the prompts' length and on how much of them all
prompts share (system prompt + worked example); synthetic text gets both wrong. These are the
turn-0 prompts of the params file's env family, one episode seed each: the action prompt
(prompt.*) of the env's first observation, which is what the train collector gives a first reply
(tests/test_action_window.py replays the env against the collector's prompts).
"""

from __future__ import annotations

from typing import Any

from longturn.agent.prompts import ActionPrompt, ActionView
from longturn.envs.registry import EnvSpec
from longturn.params.config import Params
from longturn.rollout.collection import task_of


def collector_prompts(params: Params, tokenizer: Any, n: int, first_seed: int = 0,
                      max_tries: int | None = None) -> list[list[int]]:
    """`n` distinct prompt token-id lists: seed s played by slot s % n_envs (its task, as
    slots cycle through env.tasks), seeds first_seed, first_seed + 1, ... until n different
    prompts came out (two seeds can give one layout)."""
    if n < 1:
        raise ValueError(f"need at least one prompt, got {n}")
    e, shown = params.env, ActionPrompt.from_config(params.prompt)
    tries = max_tries if max_tries is not None else 20 * n
    envs: dict[str, Any] = {}
    seen: set[tuple[int, ...]] = set()
    prompts: list[list[int]] = []
    try:
        for seed in range(first_seed, first_seed + tries):
            task = task_of(list(e.tasks), seed % params.rollout.n_envs)
            if task not in envs:
                envs[task] = EnvSpec(e.name, task, dict(e.kwargs)).build()
            env = envs[task]
            obs, _ = env.reset(seed=seed)
            view = ActionView(env.instructions, [], obs.text)
            ids = list(shown.render(tokenizer, view, params.history_window).ids)
            if tuple(ids) not in seen:
                seen.add(tuple(ids))
                prompts.append(ids)
            if len(prompts) == n:
                return prompts
    finally:
        for env in envs.values():
            env.close()
    raise ValueError(f"only {len(prompts)} distinct prompts in {tries} env seeds; ask for fewer")


def cycled(prompts: list[list[int]], size: int) -> list[list[int]]:
    """`size` prompts: the given ones repeated in order (a batch larger than the distinct set)."""
    if not prompts:
        raise ValueError("no prompts to cycle")
    return [prompts[i % len(prompts)] for i in range(size)]
