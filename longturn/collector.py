"""Fixed-turn collection: n_envs slots × turns_per_env lock-steps per iteration.

Episodes are not reset between iterations: each slot's env, history window and episode id carry
over, so an update always sees exactly n_envs × turns_per_env turns however long episodes are. A
finished episode restarts at once in its slot with a new seed and id. Rows that must be
bootstrapped (segment end, time-limit truncation) carry `bootstrap_prompt_ids`: the prompt of the
next observation, which the critic scores later.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
from typing import Any, Callable

from tqdm.auto import tqdm

from longturn.engines.base import Engine, SamplingParams
from longturn.envs.base import TextEnv
from longturn.rollout import AgentSettings, EnvSlot, generate_turns


def episode_seed(base_seed: int, rank: int, slot: int, count: int) -> int:
    """A reproducible, well-spread reset seed for the count-th episode of a slot."""
    digest = hashlib.sha256(f"{base_seed}/{rank}/{slot}/{count}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


class FixedTurnCollector:
    """Owns the env slots of one rank across iterations."""

    def __init__(self, env_factory: Callable[[str], TextEnv], tasks: list[str], n_envs: int,
                 turns_per_env: int, settings: AgentSettings, seed: int, rank: int = 0,
                 run_id: str = "run"):
        self.turns_per_env = turns_per_env
        self.seed, self.rank, self.run_id = seed, rank, run_id
        self.slots = [EnvSlot(env_factory(tasks[i % len(tasks)]), rank * n_envs + i, settings)
                      for i in range(n_envs)]
        self.episode_counts = [0] * n_envs
        for i in range(n_envs):
            self._start_next(i)

    def _start_next(self, i: int) -> None:
        count = self.episode_counts[i]
        slot = self.slots[i]
        seed = episode_seed(self.seed, self.rank, i, count)
        slot.start(seed, f"{self.run_id}-r{self.rank}-e{slot.env_index}-{count}")
        self.episode_counts[i] = count + 1

    def collect(self, engine: Engine, tokenizer: Any, sampling: SamplingParams, iteration: int,
                extra: dict[str, Any] | None = None, progress: bool = True) -> list[dict[str, Any]]:
        """Play turns_per_env lock-steps; return the rows ordered by (step, slot)."""
        rows: list[dict[str, Any]] = []
        for step in tqdm(range(self.turns_per_env), desc=f"rollout {iteration}", unit="step",
                         disable=not progress):
            step_seed = None if sampling.seed is None else sampling.seed + iteration * 100_003 + step
            step_rows = generate_turns(engine, tokenizer, self.slots,
                                       dataclasses.replace(sampling, seed=step_seed))
            last = step == self.turns_per_env - 1
            for i, row in enumerate(step_rows):
                done = row.pop("done")
                row.update(extra or {}, iteration=iteration, step=step, segment_end=last)
                needs_bootstrap = (last and not row["terminated"]) or row["truncated"]
                if needs_bootstrap and not row["aborted"]:
                    row["bootstrap_prompt_ids"] = self.slots[i].prompt(tokenizer).ids
                if done:
                    self._start_next(i)
                rows.append(row)
        return rows

    def action_names(self) -> list[str]:
        """Every action the slots' envs know, in their own order (for the action mix)."""
        return list(dict.fromkeys(a for slot in self.slots for a in slot.env.actions))

    def state(self) -> bytes:
        """Everything needed to continue the same episodes after a restart (envs included)."""
        return pickle.dumps({"slots": self.slots, "episode_counts": self.episode_counts})

    def load_state(self, blob: bytes) -> None:
        state = pickle.loads(blob)
        if len(state["slots"]) != len(self.slots):
            raise ValueError(f"checkpoint has {len(state['slots'])} env slots, params ask for "
                             f"{len(self.slots)}: resume with the same rollout.n_envs")
        for slot in self.slots:
            slot.env.close()
        self.slots, self.episode_counts = state["slots"], state["episode_counts"]
