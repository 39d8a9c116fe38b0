"""A resumed evaluation plays its remaining jobs in the slots and at the lock-steps an
uninterrupted one gave them: each journaled job holds its slot for the lock-steps it held
(`lock_steps_held` of its row), one for an episode that began but had no room for a reply.

Played by a scripted player whose episodes take a set number of replies, so the schedule is
checked alone, against a run with nothing journaled."""

from __future__ import annotations

from typing import Any

from longturn.rollout.collection import EpisodeStart
from longturn.rollout.episode_jobs import EpisodeJob, lock_steps_held, play_jobs

# replies per job; 0: it begins, finds no room for a reply and ends at that lock-step
REPLIES = {"a": 0, "b": 3, "c": 1, "d": 2, "e": 1, "f": 2}
UNSTARTED = {"u"}  # a job whose start fails


class ScriptedPlayer:
    """Slots whose episodes end after their job's number of replies."""

    def __init__(self, n_slots: int) -> None:
        self.n_slots = n_slots
        self.running: dict[int, list[Any]] = {}  # slot → [episode id, replies left, made]

    def idle(self) -> list[int]:
        return [i for i in range(self.n_slots) if i not in self.running]

    def start(self, starts: list[EpisodeStart]) -> list[EpisodeStart]:
        failed = [s for s in starts if s.episode_id in UNSTARTED]
        for s in starts:
            if s.episode_id not in UNSTARTED:
                self.running[s.slot] = [s.episode_id, REPLIES[s.episode_id], 0]
        return [EpisodeStart(s.slot, s.task, s.seed, s.episode_id, "env_error") for s in failed]

    def lock_step(self, engine, tokenizer, sampling, iteration, step, closes_batch):
        samples, ended = [], []
        for slot in sorted(self.running):
            episode = self.running[slot]
            if episode[1] > 0:
                samples.append({"episode_id": episode[0], "env_index": slot, "step": step,
                                "replies": [{"step": step, "turn": episode[2]}]})
                episode[1] -= 1
                episode[2] += 1
            elif episode[2] == 0:  # no room for a reply: a sample of no reply, as a packed one
                samples.append({"episode_id": episode[0], "env_index": slot, "step": step,
                                "replies": []})
            if episode[1] == 0:
                ended.append(slot)
                del self.running[slot]
        return samples, ended


def schedule(jobs: list[EpisodeJob], finished: dict[str, int]) -> dict[str, list[tuple]]:
    """(slot, lock-step) of every reply of each job played here."""
    played: dict[str, list[tuple]] = {}

    def on_episode(samples: list[dict[str, Any]]) -> None:
        for s in samples:
            played.setdefault(s["episode_id"], []).append((s["env_index"], s["step"]))

    play_jobs(ScriptedPlayer(2), None, None, None, jobs, finished, on_episode,
              lambda slot, job, reason: None, progress=False)
    return played


def row(job: str) -> dict[str, Any]:
    """The journal's episode row of a job played to its end (what `lock_steps_held` reads)."""
    return {"length": REPLIES.get(job, 0), "aborted": job in UNSTARTED}


def test_a_resumed_run_gives_each_remaining_job_its_slot_and_lock_steps() -> None:
    jobs = [EpisodeJob("t", i, name) for i, name in enumerate("aubcdef")]
    whole = schedule(jobs, {})
    for kept in (["a"], ["a", "u"], ["a", "u", "b"], ["u", "c"], ["a", "d"]):
        resumed = schedule(jobs, {job: lock_steps_held(row(job)) for job in kept})
        assert resumed == {job: s for job, s in whole.items() if job not in kept}, kept


def test_the_lock_steps_a_row_held() -> None:
    assert lock_steps_held({"length": 3, "aborted": False}) == 3
    assert lock_steps_held({"length": 2, "aborted": True}) == 2  # its env failed mid-episode
    assert lock_steps_held({"length": 0, "aborted": False}) == 1  # no room for a reply
    assert lock_steps_held({"length": 0, "aborted": True}) == 0  # its start failed
