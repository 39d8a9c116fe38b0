"""The train loop's collector with the chat protocol: each iteration plays `rollout.n_envs` whole
episodes per rank from fresh task seeds.

With a critic-free estimator the episodes come in groups of `algo.group_size` on one task seed
(the group is the baseline). Seeds follow from (seed, rank, iteration) alone, so a resumed run
plays what the uninterrupted one would have, and the collector's checkpoint state is empty.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from longturn.rollout.fixed_turn_collector import episode_seed
from longturn.engines.base import Engine, SamplingParams
from longturn.rollout.conversation_setup import ConversationRun


class ConversationCollector:
    """n_episodes per call, groups of `group_size` sharing a task seed (1: no groups)."""

    def __init__(self, run: ConversationRun, tasks: list[str], n_episodes: int, group_size: int,
                 seed: int, rank: int = 0, run_id: str = "train"):
        if n_episodes % group_size:
            raise ValueError(f"{n_episodes} episodes do not split into groups of {group_size}")
        self.run, self.tasks, self.n_episodes, self.group_size = run, tasks, n_episodes, group_size
        self.seed, self.rank, self.run_id = seed, rank, run_id

    def task_records(self, iteration: int) -> tuple[list[dict[str, Any]], list[str | None]]:
        """This iteration's task records (groups cycle through the tasks) and group ids."""
        records, groups = [], []
        for k in range(self.n_episodes):
            g = k // self.group_size
            task = self.tasks[g % len(self.tasks)]
            records.append(self.run.record(task, episode_seed(self.seed, self.rank, g, iteration)))
            groups.append(f"{self.run_id}-{iteration}-r{self.rank}-g{g}"
                          if self.group_size > 1 else None)
        return records, groups

    def collect(self, engine: Engine, tokenizer: Any, sampling: SamplingParams, iteration: int,
                extra: dict[str, Any], progress: bool = True) -> list[dict[str, Any]]:
        """Play this iteration's episodes; records with `extra` (run_id, policy_version) set."""
        records, groups = self.task_records(iteration)
        ids = [f"{self.run_id}-i{iteration}-r{self.rank}-e{k}" for k in range(len(records))]
        seed = None if sampling.seed is None else sampling.seed + iteration * 1_000_003
        self.run.settings.progress = progress
        out = self.run.play(engine, tokenizer, dataclasses.replace(sampling, seed=seed), records,
                            ids)
        for record, group in zip(out, groups):
            record.update(extra, iteration=iteration, group_id=group)
        return out

    def state(self) -> bytes:
        return b""  # seeds follow from the iteration: nothing to restore

    def load_state(self, blob: bytes) -> None:
        del blob

    def action_names(self) -> list[str]:
        return []
