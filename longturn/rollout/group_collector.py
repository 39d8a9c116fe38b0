"""Episode-group collection for critic-free estimators (GRPO, GiGPO).

Without a critic nothing can bootstrap a cut episode, so every iteration plays whole episodes:
the n_envs slots form groups of `group_size` that reset from one env seed (the group's episodes
differ only by sampling, which is what a group baseline compares) and step in lock-step, all slots
batched in one generation, until every episode has ended (terminated, truncated by the env or
`env.max_turns`, or aborted). An iteration therefore has a variable number of turns. Rows are the
same turn rows as FixedTurnCollector's, plus `group_id`; each episode's last row is its segment end.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Callable

from tqdm.auto import tqdm

from longturn.rollout.fixed_turn_collector import episode_seed, start_episodes
from longturn.engines.base import Engine, SamplingParams
from longturn.envs.base import TextEnv
from longturn.errors import SettingError
from longturn.rollout.env_slots import AgentSettings, EnvSlot, generate_turns


class EpisodeGroupCollector:
    """Owns one rank's env slots; each `collect` plays one round of groups to the end."""

    def __init__(self, env_factory: Callable[[str], TextEnv], tasks: list[str], n_envs: int,
                 group_size: int, settings: AgentSettings, seed: int, rank: int = 0,
                 run_id: str = "run"):
        if group_size < 1 or n_envs % group_size:
            raise SettingError(f"{n_envs} env slots do not split into groups of {group_size}")
        self.group_size, self.seed, self.rank, self.run_id = group_size, seed, rank, run_id
        # a group shares its task (and seed); groups cycle through the tasks
        envs = [env_factory(tasks[(i // group_size) % len(tasks)]) for i in range(n_envs)]
        self.slots = [EnvSlot(env, rank * n_envs + i, settings) for i, env in enumerate(envs)]
        self.rounds = 0  # rounds of groups started (the episode seeds' counter)
        self.unreported: list[list[str]] = [[] for _ in range(n_envs)]

    def _start_round(self) -> None:
        """Reset every slot (start_episodes): a group's slots on its seed; a failed reset is
        retried on the same seed."""
        def group_episode(i: int) -> tuple[int, str]:
            return (episode_seed(self.seed, self.rank, i // self.group_size, self.rounds),
                    f"{self.run_id}-r{self.rank}-e{self.slots[i].env_index}-{self.rounds}")

        start_episodes(self.slots, range(len(self.slots)), group_episode, self.unreported)
        self.rounds += 1

    def collect(self, engine: Engine, tokenizer: Any, sampling: SamplingParams, iteration: int,
                extra: dict[str, Any] | None = None, progress: bool = True) -> list[dict[str, Any]]:
        """Play every group to the end; return the rows ordered by (step, slot)."""
        self._start_round()
        groups = [f"{self.run_id}-r{self.rank}-i{iteration}-g{i // self.group_size}"
                  for i in range(len(self.slots))]
        rows: list[dict[str, Any]] = []
        active = list(range(len(self.slots)))
        bar = tqdm(desc=f"rollout {iteration}", unit="step", disable=not progress, leave=False)
        step = 0
        while active:
            step_seed = None if sampling.seed is None else sampling.seed + iteration * 100_003 + step
            step_rows = generate_turns(engine, tokenizer, [self.slots[i] for i in active],
                                       dataclasses.replace(sampling, seed=step_seed))
            still = []
            for i, row in zip(active, step_rows):
                done = row.pop("done")
                row.update(extra or {}, iteration=iteration, step=step, segment_end=done,
                           group_id=groups[i])
                if self.unreported[i]:
                    row["aborted_resets"], self.unreported[i] = self.unreported[i], []
                rows.append(row)
                if not done:
                    still.append(i)
            active = still
            step += 1
            bar.update(1)
        bar.close()
        return rows

    def action_names(self) -> list[str]:
        """Every action the slots' envs know, in their own order (for the action mix)."""
        return list(dict.fromkeys(a for slot in self.slots for a in slot.env.actions))

    def state(self) -> bytes:
        """The round counter: between iterations no episode is running."""
        return pickle.dumps({"rounds": self.rounds, "slots": len(self.slots)})

    def load_state(self, blob: bytes) -> None:
        state = pickle.loads(blob)
        if state.get("slots") != len(self.slots):
            raise SettingError(f"checkpoint has {state.get('slots')} env slots, params ask for "
                             f"{len(self.slots)}: resume with the same rollout.n_envs")
        self.rounds = int(state["rounds"])

    def close(self) -> None:
        """Close every env (and stop its worker process)."""
        for slot in self.slots:
            slot.env.close()
