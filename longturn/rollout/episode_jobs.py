"""A list of episodes fixed in advance (an evaluation's jobs: task, reset seed, id), played to
their end in a `SlotPlayer`'s slots, each slot taking the next job as its episode ends.

Why apart from the train loop's collections (rollout/collection.py): an evaluation's episodes
must play the same whatever ran beside them, and a rerun after a crash plays only what its
journal lacks (run/eval_journal.py); a job already played holds its slot for as many lock-steps
as it took, so every other job gets the slot and the lock-step it had in one run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tqdm.auto import tqdm

from longturn.engines.base import Engine, SamplingParams
from longturn.rollout.collection import EpisodeStart, Samples, SlotPlayer


@dataclass(frozen=True)
class EpisodeJob:
    """One episode of a list fixed in advance (an evaluation's): which task, reset seed and id."""

    task: str
    seed: int
    episode_id: str


def lock_steps_held(episode: dict[str, Any]) -> int:
    """How many lock-steps a finished episode (its row) held its slot: one per reply, one for an
    episode that began but had no room for a reply (its first context filled the token budget),
    none for a job whose start failed (aborted before any reply)."""
    return int(episode["length"]) or (0 if episode["aborted"] else 1)


def play_jobs(player: SlotPlayer, engine: Engine, tokenizer: Any, sampling: SamplingParams,
              jobs: list[EpisodeJob], finished: dict[str, int],
              on_episode: Callable[[Samples], None],
              on_unstarted: Callable[[int, EpisodeJob, str], None],
              progress: bool = True) -> None:
    """Play every job to its end in the player's slots; `on_episode(samples)` as each ends.

    A job whose start failed goes to `on_unstarted(slot, job, reason)`, and its slot takes the
    job after it. A job already played (`finished`: episode id → the lock-steps it held its slot,
    `lock_steps_held` of its row in an evaluation's journal) holds its slot for that many
    lock-steps without an episode, so the jobs still to play start in the slot and at the
    lock-step they would have had in one run. An evaluation has no segments: every reply's
    `segment_end` is None."""
    pending = list(reversed(jobs))
    playing: dict[int, str] = {}  # slot → the id of the episode it plays
    held: dict[int, int] = {}  # slot → lock-steps left of a finished job
    running: dict[str, Samples] = {}  # the samples of each running episode
    bar = tqdm(total=len(jobs), desc="episodes", unit="ep", disable=not progress)

    def assign(free: list[int]) -> None:
        while free and pending:
            batch = [(slot, pending.pop()) for slot in free[:len(pending)]]
            failed = {s.slot: s for s in player.start([
                EpisodeStart(slot, job.task, job.seed, job.episode_id)
                for slot, job in batch if job.episode_id not in finished])}
            playing.update((slot, job.episode_id) for slot, job in batch)
            free = []
            for slot, job in batch:  # in batch order: the order free slots take new jobs
                if job.episode_id in finished:
                    bar.update(1)
                    if finished[job.episode_id] > 0:
                        held[slot] = finished[job.episode_id]
                    else:
                        free.append(slot)
                elif slot in failed:
                    on_unstarted(slot, job, failed[slot].failure or "")
                    bar.update(1)
                    free.append(slot)

    try:  # the caller closes the player
        assign(list(range(min(player.n_slots, len(jobs)))))
        step = 0
        while held or len(player.idle()) < player.n_slots:
            samples, ended = player.lock_step(engine, tokenizer, sampling, 0, step, False)
            for sample in samples:
                for reply in sample["replies"]:
                    reply["segment_end"] = None
                running.setdefault(sample["episode_id"], []).append(sample)
            for slot in ended:
                on_episode(running.pop(playing[slot]))
                bar.update(1)
            done = [slot for slot, left in held.items() if left == 1]
            held = {slot: left - 1 for slot, left in held.items() if left > 1}
            assign(sorted(ended + done))
            step += 1
    finally:
        bar.close()
