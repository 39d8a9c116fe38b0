"""The train loop's two ways of collecting a batch, for either protocol (docs/design.md §1); the
estimator picks one (params/estimator.py), and what a protocol plays in a slot is its `SlotPlayer`.

- `FixedTurnBatches` (a critic): Verlog's fixed-turn batches, n_envs slots × turns_per_env
  lock-steps per iteration, episodes going on across iterations and cut ones bootstrapped.
- `EpisodeGroups` (critic-free, or whole episodes as context): each iteration plays every slot's
  episode to its end; slots form groups of `group_size` that reset from one seed (the episodes
  of a group differ only by sampling, which is what a group baseline compares).

Seeds and ids follow from (seed, rank, slot, count) or (seed, rank, group, iteration) alone, so
a resumed run plays what the uninterrupted one would have.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from tqdm.auto import tqdm

from longturn.engines.base import Engine, SamplingParams
from longturn.errors import SettingError

Samples = list[dict[str, Any]]  # of the one sample schema (docs/design.md §4)


def episode_seed(base_seed: int, rank: int, slot: int, count: int) -> int:
    """A reproducible, well-spread reset seed for the count-th episode of a slot (or group)."""
    digest = hashlib.sha256(f"{base_seed}/{rank}/{slot}/{count}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def restored_counters(state: dict[str, Any], counts: list[int]) -> list[int]:
    """The episode counters a checkpoint's state saved (none: `counts`), for as many slots."""
    saved = state.get("episode_counts", counts)
    if len(saved) != len(counts):
        raise SettingError(f"checkpoint has {len(saved)} episode slots, params ask for "
                           f"{len(counts)}: resume with the same rollout.n_envs")
    return list(saved)


def saved_state(blob: bytes) -> dict[str, Any]:
    """A checkpoint's collector state ({} for none). Running episodes are pickled with the
    classes that play them, so a checkpoint written by another version of longturn may not load:
    one line says so instead of an unpickling traceback."""
    try:
        return pickle.loads(blob) if blob else {}
    except (AttributeError, ImportError, pickle.UnpicklingError, EOFError) as err:
        raise SettingError(
            f"the checkpoint's rollout state cannot be read by this code ({type(err).__name__}: "
            f"{err}); another version of longturn wrote it: resume with that version, or remove "
            "the train stage's checkpoints to start over") from err


def slot_index(rank: int, n_slots: int, slot: int) -> int:
    """A slot's index over every rank: what names its episodes and chains its replies in the
    turn grid."""
    return rank * n_slots + slot


def task_of(tasks: list[str], slot: int, group_size: int | None = None) -> str:
    """The task a slot plays: slots (or groups of slots) cycle through the tasks."""
    return tasks[(slot // (group_size or 1)) % len(tasks)]


@dataclass(frozen=True)
class EpisodeStart:
    """An episode for a slot to begin: which task, which reset seed, which id (and, handed back
    by a start that failed, why)."""

    slot: int
    task: str
    seed: int
    episode_id: str
    failure: str | None = None


class SlotPlayer(Protocol):
    """What is played in n slots (rollout/conversation_player.py: conversations, of a chat task or
    of an env; serve/agent_turns.py: an agent's calls). It hands on what it played as samples:
    its own record of a reply or an episode stays inside it."""

    n_slots: int

    def idle(self) -> list[int]:
        """The slots with no running episode."""

    def start(self, starts: list[EpisodeStart]) -> list[EpisodeStart]:
        """Begin these episodes; those whose start failed, with why (their slot stays idle)."""

    def lock_step(self, engine: Engine, tokenizer: Any, sampling: SamplingParams,
                  iteration: int, step: int, closes_batch: bool) -> tuple[Samples, list[int]]:
        """One reply for every running episode in one generation: the samples complete now
        (with `closes_batch`, those of every running episode, cut there) and the slots whose
        episode ended."""

    def play_out(self, engine: Engine, tokenizer: Any, sampling: SamplingParams,
                 iteration: int, starts: list[EpisodeStart], progress: bool) -> Samples:
        """Play these episodes, one per slot, from their start to their end."""

    def action_names(self) -> list[str]:
        """Every action the slots know (the action mix), or none."""

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the running episodes."""

    def load_state(self, state: dict[str, Any]) -> list[EpisodeStart]:
        """Replace the running episodes by a checkpoint's (`state`; {} for none); the starts it
        had to make again (a conversation opened but not begun) that failed, with why."""

    def close(self) -> None:
        """Let go of every running episode and env."""


def next_start(counts: list[int], slot: int, tasks: list[str], seed: int, rank: int,
               run_id: str) -> EpisodeStart:
    """A fixed-turn slot's next episode, its counter advanced: the task, seed and id follow from
    (seed, rank, slot, count) alone (the id names the slot over every rank)."""
    count = counts[slot]
    counts[slot] = count + 1
    return EpisodeStart(slot, task_of(tasks, slot), episode_seed(seed, rank, slot, count),
                        f"{run_id}-r{rank}-e{slot_index(rank, len(counts), slot)}-{count}")


def count_failed_starts(samples: Samples, reasons: list[str]) -> Samples:
    """The batch with the reasons of the starts that failed while it was played on its last
    sample, as `aborted_resets`: counted by the batch metrics as ended, aborted episodes (they
    have no reply of their own); not a Parquet column."""
    if reasons and samples:
        samples[-1]["aborted_resets"] = [*samples[-1].get("aborted_resets", ()), *reasons]
    return samples


def play_in_lock_step(player: SlotPlayer, engine: Engine, tokenizer: Any,
                      sampling: SamplingParams, iteration: int, starts: list[EpisodeStart],
                      progress: bool) -> Samples:
    """`SlotPlayer.play_out` by lock-steps: a start that fails is retried on the same seed (a
    slot's EnvGaveUp ends the stage), then every episode steps until the last one ended. The
    samples by lock-step, then slot, as `FixedTurnBatches.collect` hands them on."""
    failures = []
    while starts:
        starts = player.start(starts)
        failures += [s.failure or "" for s in starts]
    samples: Samples = []
    bar = tqdm(desc=f"rollout {iteration}", unit="step", disable=not progress, leave=False)
    step = 0
    while len(player.idle()) < player.n_slots:
        samples += player.lock_step(engine, tokenizer, sampling, iteration, step, False)[0]
        step += 1
        bar.update(1)
    bar.close()
    samples.sort(key=lambda s: (s["replies"][0]["step"], s["env_index"]))  # as fixed-turn
    return count_failed_starts(samples, failures)


class FixedTurnBatches:
    """One rank's slots across iterations, n_envs × turns_per_env replies per collect."""

    def __init__(self, player: SlotPlayer, tasks: list[str], turns_per_env: int, seed: int,
                 rank: int = 0, run_id: str = "run"):
        self.player, self.tasks, self.turns_per_env = player, tasks, turns_per_env
        self.seed, self.rank, self.run_id = seed, rank, run_id
        self.episode_counts = [0] * player.n_slots
        self.restored_failures: list[str] = []  # starts made again on resume that failed

    def start_idle(self) -> list[str]:
        """A new episode in every idle slot; a slot whose start failed tries its next seed. Why
        each failed start failed."""
        slots, failures = self.player.idle(), []
        while slots:
            starts = [next_start(self.episode_counts, i, self.tasks, self.seed, self.rank,
                                 self.run_id) for i in slots]
            failed = self.player.start(starts)
            slots = [s.slot for s in failed]
            failures += [s.failure or "" for s in failed]
        return failures

    def collect(self, engine: Engine, tokenizer: Any, sampling: SamplingParams, iteration: int,
                extra: dict[str, Any] | None = None, progress: bool = True) -> Samples:
        """Play turns_per_env lock-steps; the samples with `extra` (run_id, policy_version) and
        the iteration set, in the order they were played: by lock-step, then slot (a player
        that hands an episode's replies on when it ends or is cut gives them in that order too,
        so the update's mini-batches are the same whichever player played)."""
        failures, self.restored_failures = self.restored_failures + self.start_idle(), []
        samples: Samples = []
        for step in tqdm(range(self.turns_per_env), desc=f"rollout {iteration}", unit="step",
                         disable=not progress):
            done, ended = self.player.lock_step(engine, tokenizer, sampling, iteration, step,
                                                step == self.turns_per_env - 1)
            samples += done
            if ended:
                failures += self.start_idle()
        samples.sort(key=lambda s: (s["replies"][0]["step"], s["env_index"]))
        for sample in samples:
            sample.update(extra or {}, iteration=iteration, group_id=None)
        return count_failed_starts(samples, failures)

    def action_names(self) -> list[str]:
        return self.player.action_names()

    def state(self) -> bytes:
        """The episode counters and whatever the player keeps of its running episodes."""
        return pickle.dumps({"episode_counts": self.episode_counts, **self.player.state()})

    def load_state(self, blob: bytes) -> None:
        state = saved_state(blob)
        # checks its slots (and closes a mismatch's envs) first
        failed = self.player.load_state(state)
        self.restored_failures = [s.failure or "" for s in failed]  # counted in the next batch
        self.episode_counts = restored_counters(state, self.episode_counts)

    def close(self) -> None:
        self.player.close()


class EpisodeGroups:
    """One rank's slots; each collect plays one episode per slot to its end. With `group_size`,
    groups of that many slots share a task and a reset seed; without (None), every slot has its
    own and no group ids. `name(slot, iteration)` is an episode's id."""

    def __init__(self, player: SlotPlayer, tasks: list[str], group_size: int | None, seed: int,
                 name: Callable[[int, int], str], rank: int = 0, run_id: str = "run"):
        size = group_size or 1
        if player.n_slots % size:
            raise SettingError(f"{player.n_slots} slots do not split into groups of {size}")
        self.player, self.tasks, self.group_size, self.name = player, tasks, group_size, name
        self.seed, self.rank, self.run_id = seed, rank, run_id

    def starts(self, iteration: int) -> tuple[list[EpisodeStart], list[str | None]]:
        """This iteration's episodes (groups cycle through the tasks) and their group ids."""
        size = self.group_size or 1
        starts, groups = [], []
        for slot in range(self.player.n_slots):
            g = slot // size
            starts.append(EpisodeStart(slot, task_of(self.tasks, slot, size),
                                       episode_seed(self.seed, self.rank, g, iteration),
                                       self.name(slot, iteration)))
            groups.append(None if self.group_size is None
                          else f"{self.run_id}-r{self.rank}-i{iteration}-g{g}")
        return starts, groups

    def collect(self, engine: Engine, tokenizer: Any, sampling: SamplingParams, iteration: int,
                extra: dict[str, Any] | None = None, progress: bool = True) -> Samples:
        """Play every slot's episode to its end; the samples with `extra`, the iteration and the
        group ids set."""
        starts, groups = self.starts(iteration)
        group_of = {s.episode_id: g for s, g in zip(starts, groups)}
        samples = self.player.play_out(engine, tokenizer, sampling, iteration, starts, progress)
        for sample in samples:
            sample.update(extra or {}, iteration=iteration,
                          group_id=group_of[sample["episode_id"]])
        return samples

    def action_names(self) -> list[str]:
        return self.player.action_names()

    def state(self) -> bytes:
        return b""  # seeds follow from the iteration, and no episode runs between iterations

    def load_state(self, blob: bytes) -> None:
        del blob

    def close(self) -> None:
        self.player.close()
