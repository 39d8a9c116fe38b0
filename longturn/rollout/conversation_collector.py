"""The train loop's collectors with the chat protocol, as the estimator says (algo/estimator.py).

- `FixedTurnConversations` (a critic, a history window): Verlog's fixed-turn batches with the
  built-in rollout, episodes that continue across updates.
- `ConversationCollector` (critic-free, the whole episode as context, or a rollout function of
  the user's own): each iteration
  plays `rollout.n_envs` whole episodes per rank from fresh task seeds; with a critic-free
  estimator in groups of `algo.group_size` on one task seed (the group is the baseline). Seeds
  follow from (seed, rank, iteration) alone, so a resumed run plays what the uninterrupted one
  would have, and its checkpoint state is empty.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tqdm.auto import tqdm

from longturn.engines.base import Engine, SamplingParams
from longturn.errors import SettingError
from longturn.rollout.chat_deltas import ChatDeltas
from longturn.rollout.conversation import Conversation
from longturn.rollout.conversation_rollout import (WINDOW, chat_deltas, finish_all, lock_step,
                                                   release_all, start_episodes)
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.fixed_turn_collector import counters_state, episode_seed, restored_counters


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


# a record's lists with one entry per reply, and its columns that sum up the whole episode
_PER_REPLY = ("segment_starts", "segment_ends", "segment_rewards", "reply_finish_reasons",
              "reply_steps", "window_prompts", "window_frames", "window_image_starts")
_EPISODE_TOTALS = ("messages", "metrics", "tool_calls", "tool_errors", "user_turns",
                   "assistant_turns", "tokenization_check")


class FixedTurnConversations:
    """Verlog's fixed-turn batches with the built-in chat rollout (a critic estimator): n_envs
    episode slots × `turns_per_env` lock-steps per iteration, one reply per slot and lock-step.

    Episodes carry over: an episode still running at the end of an iteration gives that
    iteration the replies it made there, as a `cut` record whose last reply bootstraps from what
    its next reply will be given; it goes on in the next iteration with the updated policy. An
    episode that ends is finished at once (tool rewards, the tokenization check, tools and
    interaction released) and a new one starts in its slot. Every reply is its own sample, its
    window as the prompt, chained by slot and lock-step like an env slot's turns. (With the whole
    episode as context, the verl / slime way, episodes are played whole: `ConversationCollector`.)
    The running episodes live in tools and interactions outside this process, so a resumed run
    starts new ones; the episode counters resume."""

    def __init__(self, run: ConversationRun, tasks: list[str], n_envs: int, turns_per_env: int,
                 seed: int, rank: int = 0, run_id: str = "train"):
        if run.settings.context != WINDOW:
            raise SettingError("fixed-turn batches of conversations need rollout.context window")
        self.run, self.tasks, self.turns_per_env = run, tasks, turns_per_env
        self.seed, self.rank, self.run_id, self.n_envs = seed, rank, run_id, n_envs
        self.counts = [0] * n_envs  # episodes started per slot (their seeds' counter)
        self.episodes: list[Conversation | None] = [None] * n_envs
        self.emitted = [0] * n_envs  # replies of the slot's episode already in a batch
        self.deltas: ChatDeltas | None = None

    def collect(self, engine: Engine, tokenizer: Any, sampling: SamplingParams, iteration: int,
                extra: dict[str, Any], progress: bool = True) -> list[dict[str, Any]]:
        """Play turns_per_env lock-steps; the records of the episodes (and parts of episodes)
        played in them, with `extra` (run_id, policy_version) set."""
        s = self.run.settings
        if self.deltas is None or self.deltas.tokenizer is not tokenizer:
            self.deltas = chat_deltas(engine, tokenizer, s)
        seed = None if sampling.seed is None else sampling.seed + iteration * 1_000_003
        sampling = dataclasses.replace(sampling, seed=seed)
        records: list[dict[str, Any]] = []
        for step in tqdm(range(self.turns_per_env), desc=f"rollout {iteration}", unit="step",
                         disable=not progress):
            self._start_new()
            lock_step(engine, [ep for ep in self.episodes if ep is not None], s, sampling, step)
            records += self._finish_ended()
        records += [self._part(i, self.episodes[i].record(), cut=True)
                    for i, ep in enumerate(self.episodes)
                    if ep is not None and len(ep.segments) > self.emitted[i]]
        for record in records:
            record.update(extra, iteration=iteration, group_id=None)
        return records

    def _start_new(self) -> None:
        """A new episode in every empty slot; their tools and interaction start together."""
        empty = [i for i, ep in enumerate(self.episodes) if ep is None]
        if not empty:
            return
        tasks, ids = [], []
        for i in empty:
            count, self.counts[i] = self.counts[i], self.counts[i] + 1
            task = self.tasks[i % len(self.tasks)]
            tasks.append(self.run.record(task, episode_seed(self.seed, self.rank, i, count)))
            ids.append(f"{self.run_id}-r{self.rank}-e{self.slot(i)}-{count}")
        for i, ep in zip(empty, start_episodes(self.deltas, tasks, ids, self.run.settings)):
            self.episodes[i], self.emitted[i] = ep, 0

    def _finish_ended(self) -> list[dict[str, Any]]:
        """The records of the episodes that ended (their replies not yet in a batch); their
        slots are emptied."""
        ended = [i for i, ep in enumerate(self.episodes) if ep is not None and ep.done]
        if not ended:
            return []
        full = finish_all([self.episodes[i] for i in ended], self.run.settings)
        out = []
        for i, record in zip(ended, full):
            messages = json.loads(record["messages"])
            record["success"] = self.run.success(self.episodes[i].task, messages)
            out.append(self._part(i, record, cut=False))
            self.episodes[i] = None
        return out

    def _part(self, i: int, record: dict[str, Any], cut: bool) -> dict[str, Any]:
        """The replies of slot i's episode not yet in a batch, as one record: every per-reply
        list from the first of them. A `cut` one bootstraps from the window its next reply will
        be given (in the record: `Conversation.record`)."""
        first, self.emitted[i] = self.emitted[i], len(record["segment_starts"])
        ids, starts, ends = record["input_ids"], record["segment_starts"], record["segment_ends"]
        record.update(env_index=self.slot(i), first_turn=first, cut=cut,
                      reply_observations=[" ".join(map(str, ids[ends[k - 1] if k else 0:
                                                               starts[k]]))
                                          for k in range(first, len(starts))])
        for name in _PER_REPLY:
            if name in record:
                record[name] = list(record[name][first:])
        if cut:  # the episode's own columns come with its last part
            record.update(dict.fromkeys(_EPISODE_TOTALS))
        return record

    def slot(self, i: int) -> int:
        """Slot i's index over every rank (what chains its replies in the turn grid)."""
        return self.rank * self.n_envs + i

    def state(self) -> bytes:
        """The episode counters: the running episodes cannot be kept (their tools and
        interaction hold them), so a resumed run starts new ones."""
        return counters_state(self.counts)

    def load_state(self, blob: bytes) -> None:
        counts = restored_counters(blob, self.counts)
        self.close()
        self.counts = counts

    def close(self) -> None:
        """Abandon the running episodes: tools and the interaction release them."""
        running = [ep for ep in self.episodes if ep is not None]
        self.episodes = [None] * self.n_envs
        if running:
            release_all(running, self.run.settings)

    def action_names(self) -> list[str]:
        return []
