"""The chat protocol's `SlotPlayer` (rollout/collection.py): one conversation per slot, its
replies handed on as samples (rollout/samples.py `samples_from_episodes`).

- Fixed-turn batches (a critic and a history window): one reply per running episode and
  lock-step, each reply its own sample chained by slot and lock-step (the turn grid). An episode
  still running when the batch ends hands on its replies as a `cut` record whose last reply
  bootstraps from its next window, and goes on in the next batch with the updated policy; one
  that ends is finished at once and its slot's next one starts. A checkpoint keeps the running
  episodes with their tools' and interaction's state (`episode_state`); where a plug-in cannot
  keep it (a verl-style one), a resumed run starts new episodes (the counters resume).
- Whole episodes (critic-free groups, or the whole episode as context): the run's rollout
  function plays every slot's episode; an env's conversations (no rollout function) are played
  by lock-steps, each reply its own sample, nothing bootstrapped.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from longturn.engines.base import Engine, SamplingParams
from longturn.engines.row_seeds import lock_step_seed
from longturn.errors import SettingError
from longturn.rollout.chat_deltas import ChatDeltas
from longturn.rollout.collection import (EpisodeGroups, EpisodeStart, FixedTurnBatches, Samples,
                                         count_failed_starts, play_in_lock_step, slot_index)
from longturn.rollout.conversation import Conversation
from longturn.rollout.conversation_rollout import (begin_episodes, chat_deltas, finish_all,
                                                   keep_running, lock_step, open_episodes,
                                                   release_all, release_opened, resume_running)
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.samples import CONVERSATION_COLUMNS, samples_from_episodes
from longturn.tasks.interactions import action_names as interaction_action_names

log = logging.getLogger(__name__)


class ConversationPlayer:
    """n conversation slots of one run (its tasks, tools, interaction and rollout function)."""

    def __init__(self, run: ConversationRun, n_slots: int, fixed_turns: bool, rank: int = 0,
                 keyed_seeds: bool = False):
        """`keyed_seeds`: each reply samples from a seed of its episode's id and turn alone (an
        evaluation's, `episode_turn_seed`), so it plays the same whatever shares its lock-steps."""
        if fixed_turns and run.settings.history_turns is None:
            raise SettingError("fixed-turn batches of conversations need rollout.context window")
        self.run, self.n_slots, self.rank = run, n_slots, rank
        self.fixed_turns, self.keyed_seeds = fixed_turns, keyed_seeds
        self.episodes: list[Conversation | None] = [None] * n_slots
        # opened (tools and interaction started), begun at the next lock-step: (start, record)
        self.pending: dict[int, tuple[EpisodeStart, dict[str, Any]]] = {}
        self.emitted = [0] * n_slots  # replies of the slot's episode already in a batch
        self.deltas: ChatDeltas | None = None
        self.said_not_kept = False  # the warning that running episodes cannot be kept, once

    def idle(self) -> list[int]:
        return [i for i, ep in enumerate(self.episodes) if ep is None and i not in self.pending]

    def start(self, starts: list[EpisodeStart]) -> list[EpisodeStart]:
        """Open these episodes, their tools and interaction started at once (an env behind the
        interaction resets now); those whose start failed come back with why (the collector
        counts them). The others begin at the next lock-step, where the template deltas are
        known."""
        if not starts:
            return []
        opened = open_episodes([self.run.record(s.task, s.seed) for s in starts],
                               [s.episode_id for s in starts], self.run.settings)
        failed = []
        for s, outcome in zip(starts, opened):
            if isinstance(outcome, str):
                failed.append(dataclasses.replace(s, failure=outcome))
            else:
                self.pending[s.slot] = (s, outcome)
        return failed

    def _begin_pending(self) -> None:
        if not self.pending:
            return
        slots = sorted(self.pending)
        starts, opened = zip(*(self.pending.pop(i) for i in slots))
        begun = begin_episodes(self.deltas, list(opened), [s.episode_id for s in starts],
                               self.run.settings)
        for i, ep in zip(slots, begun):
            self.episodes[i], self.emitted[i] = ep, 0

    def lock_step(self, engine: Engine, tokenizer: Any, sampling: SamplingParams,
                  iteration: int, step: int, closes_batch: bool) -> tuple[Samples, list[int]]:
        """One reply per running episode; the samples of the episodes that ended (and with
        `closes_batch` the cut ones), in slot order, and the slots that ended."""
        if self.deltas is None or self.deltas.tokenizer is not tokenizer:
            self.deltas = chat_deltas(engine, tokenizer, self.run.settings)
        for ep in self.episodes:  # resumed from a checkpoint: pickled without deltas
            if ep is not None and ep.deltas is None:
                ep.deltas = self.deltas
        self._begin_pending()
        keyed = int(sampling.seed) if self.keyed_seeds and sampling.seed is not None else None
        lock_step(engine, [ep for ep in self.episodes if ep is not None], self.run.settings,
                  dataclasses.replace(sampling, seed=lock_step_seed(sampling.seed, iteration,
                                                                    step)), step, keyed)
        ended = [i for i, ep in enumerate(self.episodes) if ep is not None and ep.done]
        records = self._finish(ended)
        for record in records:  # played whole, or ended at the batch's last lock-step: its
            if closes_batch or not self.fixed_turns:  # last reply ends its segment
                record["ends_segment"] = True
            if not self.fixed_turns:  # played whole: nothing is bootstrapped
                record.pop("bootstrap_prompt_ids", None)
        if closes_batch:
            records += [self._part(i, ep.record(self.emitted[i], totals=False), cut=True)
                        for i, ep in enumerate(self.episodes)
                        if ep is not None and len(ep.segments) > self.emitted[i]]
        return samples_from_episodes(records), ended

    def _finish(self, ended: list[int]) -> list[dict[str, Any]]:
        """The records of the episodes that ended (their replies not yet in a batch); their
        slots are emptied."""
        if not ended:
            return []
        full = finish_all([self.episodes[i] for i in ended], self.run.settings,
                          [self.emitted[i] for i in ended])
        out = []
        for i, record in zip(ended, full):
            record["success"] = self.run.succeeded(self.episodes[i].task, record)
            out.append(self._part(i, record, cut=False))
            self.episodes[i] = None
        return out

    def _part(self, i: int, record: dict[str, Any], cut: bool) -> dict[str, Any]:
        """Slot i's record of the replies not yet in a batch (`Conversation.record` from the
        first of them), as a part of its episode; a `cut` one bootstraps from the window its
        next reply will be given. The windows handed on are let go."""
        first = self.emitted[i]
        self.emitted[i] += len(record["segment_starts"])
        self.episodes[i].let_go(self.emitted[i])
        record.update(env_index=slot_index(self.rank, self.n_slots, i), first_turn=first, cut=cut)
        if self.run.of_an_env:  # the action protocol's: each sample says what
            for name in CONVERSATION_COLUMNS:  # its reply saw and did, the conversation's
                record.pop(name, None)  # messages, tool counts and template check are not kept
        return record

    def play_out(self, engine: Engine, tokenizer: Any, sampling: SamplingParams,
                 iteration: int, starts: list[EpisodeStart], progress: bool) -> Samples:
        """The run's rollout function plays every episode (their samples in slot order); the
        starts it tried again (`failed_starts`) are counted as aborted resets. Without one
        (an env's), the episodes are played by lock-steps."""
        if self.run.of_an_env:
            return play_in_lock_step(self, engine, tokenizer, sampling, iteration, starts,
                                     progress)
        seed = None if sampling.seed is None else sampling.seed + iteration * 1_000_003
        self.run.settings.progress = progress
        records = self.run.play(engine, tokenizer, dataclasses.replace(sampling, seed=seed),
                                [self.run.record(s.task, s.seed) for s in starts],
                                [s.episode_id for s in starts])
        return count_failed_starts(samples_from_episodes(records),
                                   [why for r in records for why in r.get("failed_starts", ())])

    def action_names(self) -> list[str]:
        """Every action the envs behind the run's interaction know (for the action mix); none
        for tasks that play no env."""
        return interaction_action_names(self.run.settings.interaction)

    def state(self) -> dict[str, Any]:
        """The episodes queued to begin, and the running ones with their tools' and
        interaction's state when every one of those can keep it (`keep_running`); else a
        resumed run starts new episodes in their slots (said once)."""
        out: dict[str, Any] = ({"pending": [s for s, _ in self.pending.values()]}
                               if self.pending else {})
        running = [i for i, ep in enumerate(self.episodes) if ep is not None]
        if not running:
            return out
        kept = keep_running([self.episodes[i] for i in running], self.run.settings)
        if isinstance(kept, bytes):
            out["running"] = {"slots": running, "emitted": [self.emitted[i] for i in running],
                              "episodes": kept}
        elif not self.said_not_kept:
            log.warning("running episodes are not kept in checkpoints (%s): a resumed run "
                        "starts new ones in their slots", kept)
            self.said_not_kept = True
        return out

    def load_state(self, state: dict[str, Any]) -> list[EpisodeStart]:
        """The running episodes kept (`state`), and the episodes opened but not begun, opened
        again; those whose start failed come back, as from `start`."""
        self._abandon()
        running = state.get("running")
        if running:
            if max(running["slots"]) >= self.n_slots:
                raise SettingError(f"checkpoint has a running episode in slot "
                                   f"{max(running['slots'])}, params ask for {self.n_slots} "
                                   "slots: resume with the same rollout.n_envs")
            episodes = resume_running(running["episodes"], self.run.settings)
            for i, ep, emitted in zip(running["slots"], episodes, running["emitted"]):
                self.episodes[i], self.emitted[i] = ep, emitted
        return self.start(state.get("pending", []))

    def close(self) -> None:
        """Abandon the running and the opened episodes (tools and the interaction release
        them), and let the interaction close what it holds (an env's: its envs)."""
        self._abandon()
        self.run.close()

    def _abandon(self) -> None:
        """Let the running and the opened episodes go: tools and the interaction release
        them."""
        running = [ep for ep in self.episodes if ep is not None]
        pending = list(self.pending.values())
        self.episodes, self.pending = [None] * self.n_slots, {}
        if running:
            release_all(running, self.run.settings)
        if pending:
            release_opened([task for _, task in pending], [s.episode_id for s, _ in pending],
                           self.run.settings)


def conversation_fixed_turns(run: ConversationRun, tasks: list[str], n_envs: int,
                             turns_per_env: int, seed: int, rank: int = 0,
                             run_id: str = "train") -> FixedTurnBatches:
    """Fixed-turn batches of conversations with a history window (the built-in rollout)."""
    return FixedTurnBatches(ConversationPlayer(run, n_envs, fixed_turns=True, rank=rank), tasks,
                            turns_per_env, seed, rank=rank, run_id=run_id)


def conversation_episodes(run: ConversationRun, tasks: list[str], n_envs: int,
                          group_size: int | None, seed: int, rank: int = 0,
                          run_id: str = "train") -> EpisodeGroups:
    """n_envs whole episodes per collect, in groups of `group_size` sharing a task seed (None:
    no groups). Played by the run's rollout function, each named by its iteration first; an
    env's, by lock-steps, each named by its slot over every rank first (as the episodes of
    fixed-turn batches are)."""
    if run.of_an_env:
        def name(slot: int, iteration: int) -> str:
            return f"{run_id}-r{rank}-e{slot_index(rank, n_envs, slot)}-{iteration}"
    else:
        def name(slot: int, iteration: int) -> str:
            return f"{run_id}-i{iteration}-r{rank}-e{slot}"
    return EpisodeGroups(ConversationPlayer(run, n_envs, fixed_turns=False, rank=rank), tasks,
                         group_size, seed, name, rank=rank, run_id=run_id)
