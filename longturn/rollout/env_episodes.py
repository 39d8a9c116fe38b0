"""A list of episodes played to their end by env slots in lock-step: evaluation's jobs (task,
seed, id), up to `parallel_envs` at a time, each slot taking the next job as its episode ends.

Why apart from the train loop's collection (rollout/collection.py): an evaluation's episodes are
fixed in advance and must play the same whatever ran beside them, so each episode samples from
its own seeds (`episode_sampling`), a slot's env is rebuilt only when its next job is of another
task, and a rerun after a crash replays only what the journal lacks (run/eval_journal.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from tqdm.auto import tqdm

from longturn.engines.base import Engine, SamplingParams
from longturn.engines.row_seeds import keyed_seed, row_seed
from longturn.envs.base import TextEnv
from longturn.rollout.collection import EpisodeJob
from longturn.rollout.env_slots import AgentSettings, EnvSlot, generate_turns
from longturn.rollout.sample_metrics import episode_row
from longturn.rollout.samples import sample_from_turn


def unstarted_episode(slot: EnvSlot, job: EpisodeJob, reason: str,
                      extra: dict[str, Any]) -> dict[str, Any]:
    """The episodes.parquet row of a job whose reset failed: aborted before its first turn."""
    return {
        "run_id": extra.get("run_id"), "policy_version": extra.get("policy_version"),
        "env_name": slot.env.name, "task": job.task, "episode_id": job.episode_id,
        "episode_seed": job.seed, "success": False, "return": 0.0, "env_return": 0.0,
        "length": 0, "valid_actions": 0, "valid_action_ratio": 0.0, "terminated": False,
        "truncated": False, "aborted": True, "termination": reason,
    }


class _EpisodeQueue:
    """The eval jobs and the slots that play them: one env per slot index, rebuilt only when the
    slot's next job is of another task; new envs start together, resets run in parallel.

    A job already played (`finished`: episode id → its number of turns, from an evaluation's
    journal) takes its slot for that many lock-steps without an env or a generation, so the jobs
    still to play start in the slot and at the step they would have had in one uninterrupted run."""

    def __init__(self, env_factory: Callable[[str], TextEnv], jobs: list[EpisodeJob],
                 settings: AgentSettings, extra: dict[str, Any], bar: Any,
                 finished: dict[str, int], on_episode: Callable[..., None] | None):
        self.env_factory, self.settings, self.extra, self.bar = env_factory, settings, extra, bar
        self.finished, self.on_episode = finished, on_episode
        self.pending = list(reversed(jobs))
        self.slots: dict[int, EnvSlot] = {}
        self.tasks: dict[int, str] = {}
        self.active: dict[int, EnvSlot] = {}
        self.replayed: dict[int, int] = {}  # slot → lock-steps left of a finished job
        self.episodes: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []  # of the ended episodes, when no on_episode

    def assign(self, free: list[int]) -> None:
        """The next jobs into these free slots; a job whose reset fails is recorded as an aborted
        episode and its slot takes the job after it (so does a finished job of no turns)."""
        while free and self.pending:
            batch = [(index, self.pending.pop()) for index in free[:len(self.pending)]]
            to_play = [(index, job) for index, job in batch if job.episode_id not in self.finished]
            fresh = {index: self.env_factory(job.task) for index, job in to_play
                     if self.tasks.get(index) != job.task}
            for index, env in fresh.items():
                if index in self.slots:
                    self.slots[index].env.close()
                self.slots[index] = EnvSlot(env, index, self.settings)
            for index, job in to_play:
                self.tasks[index] = job.task
                self.slots[index].begin_start(job.seed, job.episode_id)
            free = []
            for index, job in batch:  # in batch order: the order the free slots take new jobs
                if job.episode_id in self.finished:
                    self.bar.update(1)
                    if self.finished[job.episode_id] > 0:
                        self.replayed[index] = self.finished[job.episode_id]
                    else:
                        free.append(index)
                    continue
                failure = self.slots[index].finish_start()
                if failure is None:
                    self.active[index] = self.slots[index]
                    continue
                self.ended(unstarted_episode(self.slots[index], job, failure.reason, self.extra),
                           [])
                free.append(index)

    def ended(self, episode: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        self.episodes.append(episode)
        self.bar.update(1)
        if self.on_episode is not None:
            self.on_episode(episode, samples)
        else:
            self.samples += samples

    def tick(self) -> list[int]:
        """One lock-step of the finished jobs; the slots whose job ends with it."""
        for index in self.replayed:
            self.replayed[index] -= 1
        done = [index for index, left in self.replayed.items() if left == 0]
        for index in done:
            del self.replayed[index]
        return done

    def close(self) -> None:
        for slot in self.slots.values():
            slot.env.close()


def episode_sampling(sampling: SamplingParams, slots: list[EnvSlot]) -> SamplingParams:
    """One seed per prompt, from the run's seed, the slot's episode id and its turn: an episode
    samples the same whichever episodes share its lock-step, so a resumed evaluation replays
    exactly what an uninterrupted one would have played."""
    if sampling.seed is None:
        return sampling
    seeds = tuple(row_seed(keyed_seed(int(sampling.seed), slot.episode_id), slot.turn)
                  for slot in slots)
    return dataclasses.replace(sampling, seed=seeds)


def play_episodes(
    engine: Engine, tokenizer: Any, env_factory: Callable[[str], TextEnv], jobs: list[EpisodeJob],
    parallel_envs: int, sampling: SamplingParams, settings: AgentSettings,
    extra: dict[str, Any] | None = None, progress: bool = True,
    finished: dict[str, int] | None = None,
    on_episode: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Play every job to its end with up to `parallel_envs` envs in lock-step.

    Returns (samples, episode rows) of the jobs played here: a sample of one reply per turn
    (`sample_from_turn`), episode after episode as they ended; an episode whose env failed is an
    episode row, `aborted`. Each episode's sampling seeds depend only on the run's seed, its id and
    the turn, so the same jobs, params and seed give the same episodes. Jobs in `finished` (episode
    id → turns) are not played but keep their slot for as many lock-steps, so every other job gets
    the slot and steps it gets in an uninterrupted run. `on_episode(episode, samples)` is called as
    each episode ends (an evaluation's journal); the samples then go only there, not into the
    returned list as well (an evaluation's samples need not be held twice).
    """
    extra = extra or {}
    bar = tqdm(total=len(jobs), desc="episodes", unit="ep", disable=not progress)
    queue = _EpisodeQueue(env_factory, jobs, settings, extra, bar, finished or {}, on_episode)
    running: dict[str, list[dict[str, Any]]] = {}  # the samples of each running episode
    step = 0
    try:
        queue.assign(list(range(min(parallel_envs, len(jobs)))))
        while queue.active or queue.replayed:
            order = sorted(queue.active)
            slots = [queue.active[i] for i in order]
            rows = generate_turns(engine, tokenizer, slots, episode_sampling(sampling, slots)) \
                if slots else []
            ended = []
            for index, row in zip(order, rows):
                done = row.pop("done")
                row.update(extra, step=step, segment_end=None)  # no segments in evaluation
                running.setdefault(row["episode_id"], []).append(sample_from_turn(row))
                if done:
                    played = running.pop(row["episode_id"])
                    queue.ended(episode_row(played), played)
                    del queue.active[index]
                    ended.append(index)
            queue.assign(sorted(ended + queue.tick()))
            step += 1
    finally:
        bar.close()
        queue.close()
    return queue.samples, queue.episodes
