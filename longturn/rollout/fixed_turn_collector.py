"""Fixed-turn collection: n_envs slots × turns_per_env lock-steps per iteration.

Episodes are not reset between iterations: each slot's env, history window and episode id carry
over, so an update always sees exactly n_envs × turns_per_env turns however long episodes are. A
finished episode restarts at once in its slot with a new seed and id. Rows that must be
bootstrapped (segment end, time-limit truncation) carry `bootstrap_prompt_ids`: the prompt of the
next observation, which the critic scores later. An env that fails aborts its episode and is
restarted (`longturn/rollout/env_slots.py`); the slot goes on with a new episode.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
from typing import Any, Callable, Iterable

from tqdm.auto import tqdm

from longturn.engines.base import Engine, SamplingParams
from longturn.envs.base import TextEnv
from longturn.errors import SettingError
from longturn.rollout.env_slots import AgentSettings, EnvSlot, generate_turns


def episode_seed(base_seed: int, rank: int, slot: int, count: int) -> int:
    """A reproducible, well-spread reset seed for the count-th episode of a slot."""
    digest = hashlib.sha256(f"{base_seed}/{rank}/{slot}/{count}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def counters_state(counts: list[int]) -> bytes:
    """The checkpoint of a fixed-turn collector whose running episodes cannot be kept (they live
    in tools, interactions or agent threads): the episodes each slot started, so a resumed run's
    new episodes take new seeds and ids."""
    return pickle.dumps({"episode_counts": list(counts)})


def restored_counters(blob: bytes, counts: list[int]) -> list[int]:
    """The counters `counters_state` saved (an empty blob keeps `counts`), for as many slots."""
    saved = pickle.loads(blob)["episode_counts"] if blob else counts
    if len(saved) != len(counts):
        raise SettingError(f"checkpoint has {len(saved)} episode slots, params ask for "
                           f"{len(counts)}: resume with the same rollout.n_envs")
    return list(saved)


def start_episodes(slots: list[EnvSlot], todo: Iterable[int],
                   episode_for: Callable[[int], tuple[int, str]],
                   unreported: list[list[str]]) -> None:
    """Reset these slots in parallel to `episode_for(i)` = (seed, episode id). A failed reset is
    recorded in `unreported[i]` (carried by the slot's next row) and the slot asks `episode_for`
    again (the slot's EnvGaveUp ends the stage after env.max_retries failures in a row)."""
    todo = list(todo)
    while todo:
        for i in todo:
            slots[i].begin_start(*episode_for(i))
        failed = []
        for i in todo:
            failure = slots[i].finish_start()
            if failure is not None:
                unreported[i].append(failure.reason)
                failed.append(i)
        todo = failed


class FixedTurnCollector:
    """Owns the env slots of one rank across iterations."""

    def __init__(self, env_factory: Callable[[str], TextEnv], tasks: list[str], n_envs: int,
                 turns_per_env: int, settings: AgentSettings, seed: int, rank: int = 0,
                 run_id: str = "run"):
        self.turns_per_env = turns_per_env
        self.seed, self.rank, self.run_id = seed, rank, run_id
        envs = [env_factory(tasks[i % len(tasks)]) for i in range(n_envs)]  # workers start together
        self.slots = [EnvSlot(env, rank * n_envs + i, settings) for i, env in enumerate(envs)]
        self.episode_counts = [0] * n_envs
        # reasons of episodes whose reset failed, not yet carried by a row (`aborted_resets`)
        self.unreported: list[list[str]] = [[] for _ in range(n_envs)]
        try:
            self._start_next(range(n_envs))
        except BaseException:  # an env that never starts stops the stage: leave no worker behind
            self.close()
            raise

    def _start_next(self, indices: Iterable[int]) -> None:
        """New episodes in these slots (start_episodes); after a failed reset a slot tries the
        next seed."""
        def next_episode(i: int) -> tuple[int, str]:
            count = self.episode_counts[i]
            self.episode_counts[i] = count + 1
            return (episode_seed(self.seed, self.rank, i, count),
                    f"{self.run_id}-r{self.rank}-e{self.slots[i].env_index}-{count}")

        start_episodes(self.slots, indices, next_episode, self.unreported)

    def collect(self, engine: Engine, tokenizer: Any, sampling: SamplingParams, iteration: int,
                extra: dict[str, Any] | None = None, progress: bool = True) -> list[dict[str, Any]]:
        """Play turns_per_env lock-steps; return the rows ordered by (step, slot).

        An episode whose reset failed has no turn: its termination reason rides on its slot's
        row of that step as `aborted_resets` (counted by the rollout metrics, not in Parquet)."""
        rows: list[dict[str, Any]] = []
        for step in tqdm(range(self.turns_per_env), desc=f"rollout {iteration}", unit="step",
                         disable=not progress):
            step_seed = None if sampling.seed is None else sampling.seed + iteration * 100_003 + step
            step_rows = generate_turns(engine, tokenizer, self.slots,
                                       dataclasses.replace(sampling, seed=step_seed))
            last = step == self.turns_per_env - 1
            ended = []
            for i, row in enumerate(step_rows):
                if row.pop("done"):
                    ended.append(i)
                row.update(extra or {}, iteration=iteration, step=step, segment_end=last)
                needs_bootstrap = (last and not row["terminated"]) or row["truncated"]
                if needs_bootstrap and not row["aborted"]:
                    row["bootstrap_prompt_ids"] = self.slots[i].prompt(tokenizer).ids
            self._start_next(ended)
            for i, row in enumerate(step_rows):
                if self.unreported[i]:
                    row["aborted_resets"], self.unreported[i] = self.unreported[i], []
            rows.extend(step_rows)
        return rows

    def action_names(self) -> list[str]:
        """Every action the slots' envs know, in their own order (for the action mix)."""
        return list(dict.fromkeys(a for slot in self.slots for a in slot.env.actions))

    def state(self) -> bytes:
        """Everything needed to continue the same episodes after a restart (envs included: an env
        in a worker process is pickled there)."""
        return pickle.dumps({"slots": self.slots, "episode_counts": self.episode_counts,
                             "unreported": self.unreported})

    def load_state(self, blob: bytes) -> None:
        state = pickle.loads(blob)
        if len(state["slots"]) != len(self.slots):
            for slot in state["slots"]:
                slot.env.close()
            raise SettingError(f"checkpoint has {len(state['slots'])} env slots, params ask for "
                             f"{len(self.slots)}: resume with the same rollout.n_envs")
        self.close()
        self.slots, self.episode_counts = state["slots"], state["episode_counts"]
        self.unreported = state.get("unreported") or [[] for _ in self.slots]

    def close(self) -> None:
        """Close every env (and stop its worker process)."""
        for slot in self.slots:
            slot.env.close()
