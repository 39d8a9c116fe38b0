"""The action protocol's `SlotPlayer` (rollout/collection.py): one env slot per slot
(rollout/env_slots.py), every running slot's turn generated in one batch per lock-step, one
sample of one reply per turn (the slot's turn row, rollout/samples.py `sample_from_turn`).

In fixed-turn batches a reply's `segment_end` marks the batch's last lock-step, and a sample that
must be bootstrapped (the batch cut its episode, or a time limit truncated it) carries
`bootstrap_prompt_ids`: the prompt of the next observation, which the critic scores later.
Played whole, an episode's last reply is its segment end and nothing is bootstrapped. A reset
that failed has no sample: its termination reason rides on the slot's sample of that lock-step
(or its next one) as `aborted_resets`, counted by the rollout metrics, not in Parquet.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Callable

from longturn.engines.base import Engine, SamplingParams
from longturn.envs.base import TextEnv
from longturn.errors import SettingError
from longturn.rollout.collection import (EpisodeGroups, EpisodeStart, FixedTurnBatches, Samples,
                                         play_in_lock_step, slot_index, task_of)
from longturn.rollout.env_slots import AgentSettings, EnvSlot, generate_turns
from longturn.rollout.samples import sample_from_turn


class EnvPlayer:
    """n env slots, each on its own env of its task (slot i plays `tasks_by_slot[i]`)."""

    def __init__(self, env_factory: Callable[[str], TextEnv], tasks_by_slot: list[str],
                 settings: AgentSettings, whole_episodes: bool, rank: int = 0):
        self.n_slots, self.whole_episodes = len(tasks_by_slot), whole_episodes
        envs = [env_factory(task) for task in tasks_by_slot]  # worker processes start together
        self.slots = [EnvSlot(env, slot_index(rank, self.n_slots, i), settings)
                      for i, env in enumerate(envs)]
        self.running = [False] * self.n_slots
        # reasons of episodes whose reset failed, not yet carried by a sample
        self.unreported: list[list[str]] = [[] for _ in self.slots]
        self.step_samples: dict[int, dict[str, Any]] = {}  # slot → its last lock-step's sample

    def idle(self) -> list[int]:
        return [i for i, running in enumerate(self.running) if not running]

    def start(self, starts: list[EpisodeStart]) -> list[EpisodeStart]:
        """Reset these slots in parallel; a failed reset is counted on the slot's sample (the env
        was restarted; after env.max_retries failures in a row the slot's EnvGaveUp ends the
        stage)."""
        for s in starts:
            self.slots[s.slot].begin_start(s.seed, s.episode_id)
        failed = []
        for s in starts:
            failure = self.slots[s.slot].finish_start()
            if failure is None:
                self.running[s.slot] = True
                continue
            sample = self.step_samples.get(s.slot)
            if sample is not None:
                sample.setdefault("aborted_resets", []).append(failure.reason)
            else:
                self.unreported[s.slot].append(failure.reason)
            failed.append(s)
        return failed

    def lock_step(self, engine: Engine, tokenizer: Any, sampling: SamplingParams,
                  iteration: int, step: int, closes_batch: bool) -> tuple[Samples, list[int]]:
        """Every running slot's turn as a sample, in slot order, and the slots whose episode
        ended."""
        active = [i for i, running in enumerate(self.running) if running]
        seed = None if sampling.seed is None else sampling.seed + iteration * 100_003 + step
        rows = generate_turns(engine, tokenizer, [self.slots[i] for i in active],
                              dataclasses.replace(sampling, seed=seed))
        ended = []
        self.step_samples = {}
        for i, row in zip(active, rows):
            done = row.pop("done")
            row.update(step=step, segment_end=done if self.whole_episodes else closes_batch)
            cut = closes_batch and not row["terminated"]
            if not self.whole_episodes and (cut or row["truncated"]) and not row["aborted"]:
                row["bootstrap_prompt_ids"] = self.slots[i].prompt(tokenizer).ids
            if self.unreported[i]:
                row["aborted_resets"], self.unreported[i] = self.unreported[i], []
            if done:
                self.running[i] = False
                ended.append(i)
            self.step_samples[i] = sample_from_turn(row)
        return list(self.step_samples.values()), ended

    def play_out(self, engine: Engine, tokenizer: Any, sampling: SamplingParams,
                 iteration: int, starts: list[EpisodeStart], progress: bool) -> Samples:
        self.step_samples = {}  # a reset failed now is carried by the slot's first sample
        return play_in_lock_step(self, engine, tokenizer, sampling, iteration, starts, progress)

    def action_names(self) -> list[str]:
        """Every action the slots' envs know, in their own order (for the action mix)."""
        return list(dict.fromkeys(a for slot in self.slots for a in slot.env.actions))

    def state(self) -> dict[str, Any]:
        """The slots, envs included (an env in a worker process is pickled there): a resumed
        run continues the same episodes."""
        return {"slots": self.slots, "unreported": self.unreported}

    def load_state(self, state: dict[str, Any]) -> None:
        if "slots" not in state:
            return
        if len(state["slots"]) != len(self.slots):
            for slot in state["slots"]:
                slot.env.close()
            raise SettingError(f"checkpoint has {len(state['slots'])} env slots, params ask for "
                               f"{len(self.slots)}: resume with the same rollout.n_envs")
        self.close()
        self.slots = state["slots"]
        self.unreported = state.get("unreported") or [[] for _ in self.slots]
        self.running, self.step_samples = [True] * self.n_slots, {}

    def close(self) -> None:
        """Close every env (and stop its worker process)."""
        for slot in self.slots:
            slot.env.close()


def env_fixed_turns(env_factory: Callable[[str], TextEnv], tasks: list[str], n_envs: int,
                    turns_per_env: int, settings: AgentSettings, seed: int, rank: int = 0,
                    run_id: str = "run") -> FixedTurnBatches:
    """Fixed-turn batches of env slots, slot i on `tasks[i % len(tasks)]`."""
    player = EnvPlayer(env_factory, [task_of(tasks, i) for i in range(n_envs)], settings,
                       whole_episodes=False, rank=rank)
    return FixedTurnBatches(player, tasks, turns_per_env, seed, rank=rank, run_id=run_id)


def env_groups(env_factory: Callable[[str], TextEnv], tasks: list[str], n_envs: int,
               group_size: int, settings: AgentSettings, seed: int, rank: int = 0,
               run_id: str = "run") -> EpisodeGroups:
    """Groups of whole episodes in env slots; a group shares its task and seed."""
    if group_size < 1 or n_envs % group_size:
        raise SettingError(f"{n_envs} env slots do not split into groups of {group_size}")
    player = EnvPlayer(env_factory, [task_of(tasks, i, group_size) for i in range(n_envs)],
                       settings, whole_episodes=True, rank=rank)
    def name(slot: int, iteration: int) -> str:
        return f"{run_id}-r{rank}-e{slot_index(rank, n_envs, slot)}-{iteration}"

    return EpisodeGroups(player, tasks, group_size, seed, name, rank=rank, run_id=run_id)
