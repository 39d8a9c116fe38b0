"""The action protocol's `SlotPlayer` (rollout/collection.py): one env slot per slot
(rollout/env_slots.py), every running slot's turn generated in one batch per lock-step, one
sample of one reply per turn (the slot's turn row, rollout/samples.py `sample_from_turn`).

In fixed-turn batches a reply's `segment_end` marks the batch's last lock-step, and a sample that
must be bootstrapped (the batch cut its episode, or a time limit truncated it) carries
`bootstrap_prompt_ids`: the prompt of the next observation, which the critic scores later.
Played whole, an episode's last reply is its segment end and nothing is bootstrapped. A reset
that failed has no sample: `start` hands it back with its reason, and the collector counts it.

An evaluation's list of episodes (`play_episodes`) is played by the same slots through
`play_jobs`: each reply samples from seeds of its episode alone, and a slot gets a new env only
when its next episode is of another task.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from longturn.engines.base import Engine, SamplingParams, engine_image_token
from longturn.engines.row_seeds import episode_turn_seed, lock_step_seed
from longturn.envs.base import TextEnv
from longturn.errors import SettingError
from longturn.rollout.collection import (EpisodeGroups, EpisodeStart, FixedTurnBatches, Samples,
                                         play_in_lock_step, slot_index, task_of)
from longturn.rollout.episode_jobs import EpisodeJob, play_jobs
from longturn.rollout.env_slots import AgentSettings, EnvSlot, generate_turns, prompt_frames
from longturn.rollout.sample_metrics import episode_row, unstarted_row
from longturn.rollout.samples import sample_from_turn


class EnvPlayer:
    """n env slots, each on its own env of its task (slot i plays `tasks_by_slot[i]`)."""

    def __init__(self, env_factory: Callable[[str], TextEnv], tasks_by_slot: list[str],
                 settings: AgentSettings, whole_episodes: bool, rank: int = 0,
                 keyed_seeds: bool = False):
        """`keyed_seeds`: each reply samples from a seed of its episode's id and turn alone (an
        evaluation's), not of the iteration and lock-step, so an episode plays the same
        whatever shares its lock-steps."""
        self.n_slots, self.whole_episodes = len(tasks_by_slot), whole_episodes
        self.env_factory, self.settings, self.rank = env_factory, settings, rank
        self.keyed_seeds = keyed_seeds
        self.tasks = list(tasks_by_slot)  # the task of each slot's env
        envs = [env_factory(task) for task in tasks_by_slot]  # worker processes start together
        self.slots = [EnvSlot(env, slot_index(rank, self.n_slots, i), settings)
                      for i, env in enumerate(envs)]
        self.running = [False] * self.n_slots

    def idle(self) -> list[int]:
        return [i for i, running in enumerate(self.running) if not running]

    def start(self, starts: list[EpisodeStart]) -> list[EpisodeStart]:
        """Reset these slots in parallel; those whose reset failed come back with why (the env
        was restarted; after env.max_retries failures in a row the slot's EnvGaveUp ends the
        stage). A slot whose env is of another task gets a new env first (new ones start
        together)."""
        fresh = {s.slot: self.env_factory(s.task) for s in starts if self.tasks[s.slot] != s.task}
        for s in starts:
            if s.slot in fresh:
                self.slots[s.slot].env.close()
                self.slots[s.slot] = EnvSlot(fresh[s.slot], slot_index(self.rank, self.n_slots,
                                                                       s.slot), self.settings)
                self.tasks[s.slot] = s.task
        for s in starts:
            self.slots[s.slot].begin_start(s.seed, s.episode_id)
        failed = []
        for s in starts:
            failure = self.slots[s.slot].finish_start()
            if failure is None:
                self.running[s.slot] = True
            else:
                failed.append(dataclasses.replace(s, failure=failure.reason))
        return failed

    def lock_step(self, engine: Engine, tokenizer: Any, sampling: SamplingParams,
                  iteration: int, step: int, closes_batch: bool) -> tuple[Samples, list[int]]:
        """Every running slot's turn as a sample, in slot order, and the slots whose episode
        ended."""
        active = [i for i, running in enumerate(self.running) if running]
        slots = [self.slots[i] for i in active]
        if self.keyed_seeds:
            sampling = episode_sampling(sampling, slots)
        else:
            sampling = dataclasses.replace(sampling,
                                           seed=lock_step_seed(sampling.seed, iteration, step))
        rows = generate_turns(engine, tokenizer, slots, sampling) if slots else []
        ended, samples = [], []
        for i, row in zip(active, rows):
            done = row.pop("done")
            row.update(step=step, segment_end=done if self.whole_episodes else closes_batch)
            cut = closes_batch and not row["terminated"]
            if not self.whole_episodes and (cut or row["truncated"]) and not row["aborted"]:
                following = self.slots[i].prompt(tokenizer, engine_image_token(engine))
                row.update(bootstrap_prompt_ids=following.ids,
                           **prompt_frames(following, "bootstrap_"))
            if done:
                self.running[i] = False
                ended.append(i)
            samples.append(sample_from_turn(row))
        return samples, ended

    def play_out(self, engine: Engine, tokenizer: Any, sampling: SamplingParams,
                 iteration: int, starts: list[EpisodeStart], progress: bool) -> Samples:
        return play_in_lock_step(self, engine, tokenizer, sampling, iteration, starts, progress)

    def action_names(self) -> list[str]:
        """Every action the slots' envs know, in their own order (for the action mix)."""
        return list(dict.fromkeys(a for slot in self.slots for a in slot.env.actions))

    def state(self) -> dict[str, Any]:
        """The slots, envs included (an env in a worker process is pickled there): a resumed
        run continues the same episodes."""
        return {"slots": self.slots}

    def load_state(self, state: dict[str, Any]) -> list[EpisodeStart]:
        """The checkpoint's slots, envs and running episodes as they were, under this run's
        settings: no start is made again."""
        if "slots" not in state:
            return []
        if len(state["slots"]) != len(self.slots):
            for slot in state["slots"]:
                slot.env.close()
            raise SettingError(f"checkpoint has {len(state['slots'])} env slots, params ask for "
                               f"{len(self.slots)}: resume with the same rollout.n_envs")
        self.close()
        self.slots = state["slots"]
        for slot in self.slots:  # this run's settings (a slot pickled before an upgrade has
            slot.settings = self.settings  # the fields of its time)
        self.running = [True] * self.n_slots
        return []

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


def episode_sampling(sampling: SamplingParams, slots: list[EnvSlot]) -> SamplingParams:
    """One seed per prompt, from the run's seed, the slot's episode id and its turn: an episode
    samples the same whichever episodes share its lock-step, so a resumed evaluation replays
    exactly what an uninterrupted one would have played."""
    if sampling.seed is None:
        return sampling
    seeds = tuple(episode_turn_seed(int(sampling.seed), slot.episode_id, slot.turn)
                  for slot in slots)
    return dataclasses.replace(sampling, seed=seeds)


def play_episodes(
    engine: Engine, tokenizer: Any, env_factory: Callable[[str], TextEnv], jobs: list[EpisodeJob],
    parallel_envs: int, sampling: SamplingParams, settings: AgentSettings,
    extra: dict[str, Any] | None = None, progress: bool = True,
    finished: dict[str, int] | None = None,
    on_episode: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Play every job (an evaluation's) to its end in up to `parallel_envs` env slots
    (`play_jobs`), each episode sampling from its own seeds (`episode_sampling`).

    Returns (samples, episode rows) of the jobs played here, episode after episode as they
    ended; a job whose reset failed is an episode row, `aborted`, of no reply. Jobs in `finished`
    (episode id → replies) are not played but keep their slot for as many lock-steps.
    `on_episode(episode, samples)` is called as each episode ends (an evaluation's journal); the
    samples then go only there, not into the returned list as well.
    """
    extra = extra or {}
    finished = finished or {}
    player = EnvPlayer(env_factory, [job.task for job in jobs[:parallel_envs]], settings,
                       whole_episodes=True, keyed_seeds=True)  # slot i's first job is job i
    episodes: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []

    def ended(episode: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        episodes.append(episode)
        if on_episode is not None:
            on_episode(episode, samples)
        else:
            kept.extend(samples)

    def played(samples: Samples) -> None:
        for sample in samples:
            sample.update(extra)
        ended(episode_row(samples), samples)

    def unstarted(slot: int, job: EpisodeJob, reason: str) -> None:
        ended(unstarted_row(extra.get("run_id"), extra.get("policy_version"),
                            player.slots[slot].env.name, job.task, job.episode_id, job.seed,
                            reason), [])

    try:
        play_jobs(player, engine, tokenizer, sampling, jobs, finished, played, unstarted,
                  progress)
    finally:
        player.close()
    return kept, episodes
