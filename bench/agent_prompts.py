"""Real agent prompts for benches, built exactly as the collector builds them.

Why: generation and training costs depend on the prompts' length and on how much of them all
prompts share (system prompt + worked example); synthetic text gets both wrong. These are the
turn-0 prompts of the params file's env family, one episode seed each, from env slots on the
params' settings (`env_fixed_turns(...).player.slots[i].prompt(tokenizer)`): byte for byte the
prompts the train collector gives, whichever player plays it (tests/test_action_window.py).
"""

from __future__ import annotations

from typing import Any

from longturn.params.config import Params
from longturn.rollout.env_player import env_fixed_turns
from longturn.rollout.env_slots import AgentSettings, env_factory_from_params


def collector_prompts(params: Params, tokenizer: Any, n: int, first_seed: int = 0,
                      max_tries: int | None = None) -> list[list[int]]:
    """`n` distinct prompt token-id lists: slot i % n_envs restarted on seeds first_seed,
    first_seed + 1, ... until n different prompts came out (two seeds can give one layout)."""
    if n < 1:
        raise ValueError(f"need at least one prompt, got {n}")
    collector = env_fixed_turns(env_factory_from_params(params), list(params.env.tasks),
                                params.rollout.n_envs, params.rollout.turns_per_env,
                                AgentSettings.from_params(params), params.seed, run_id="bench")
    tries = max_tries if max_tries is not None else 20 * n
    seen: set[tuple[int, ...]] = set()
    prompts: list[list[int]] = []
    slots = collector.player.slots
    try:
        for seed in range(first_seed, first_seed + tries):
            slot = slots[seed % len(slots)]
            slot.start(seed, f"bench-{seed}")
            ids = list(slot.prompt(tokenizer).ids)
            if tuple(ids) not in seen:
                seen.add(tuple(ids))
                prompts.append(ids)
            if len(prompts) == n:
                return prompts
    finally:
        collector.close()  # the slots' envs (and their worker processes)
    raise ValueError(f"only {len(prompts)} distinct prompts in {tries} env seeds; ask for fewer")


def cycled(prompts: list[list[int]], size: int) -> list[list[int]]:
    """`size` prompts: the given ones repeated in order (a batch larger than the distinct set)."""
    if not prompts:
        raise ValueError("no prompts to cycle")
    return [prompts[i % len(prompts)] for i in range(size)]
