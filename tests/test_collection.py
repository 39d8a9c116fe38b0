"""The two collections (rollout/collection.py) over a scripted SlotPlayer: which episodes they
start in which slots, with which seeds and ids, and what a checkpoint keeps. The real player
(conversations, of an env or a chat task) is exercised in test_collector.py,
test_action_window.py, test_critic_free.py and test_fixed_turn_conversations.py."""

from __future__ import annotations

import dataclasses

import pytest

from longturn.errors import SettingError
from longturn.rollout.collection import (EpisodeGroups, EpisodeStart, FixedTurnBatches,
                                         episode_seed, play_in_lock_step)
from settings_from_params import sampling_settings


class ScriptedPlayer:
    """Slots whose episodes last `length` lock-steps; the starts listed in `fail` fail once."""

    def __init__(self, n_slots: int, length: int, fail: tuple[str, ...] = ()):
        self.n_slots, self.length, self.fail = n_slots, length, set(fail)
        self.running: dict[int, list] = {}  # slot → [start, replies made]
        self.started: list[EpisodeStart] = []

    def idle(self):
        return [i for i in range(self.n_slots) if i not in self.running]

    def start(self, starts):
        failed = [s for s in starts if s.episode_id in self.fail]
        self.fail -= {s.episode_id for s in failed}
        for s in starts:
            if s not in failed:
                self.running[s.slot] = [s, 0]
                self.started.append(s)
        return [dataclasses.replace(s, failure="env_error") for s in failed]

    def lock_step(self, engine, tokenizer, sampling, iteration, step, closes_batch):
        rows, ended = [], []
        for slot in sorted(self.running):
            start, made = self.running[slot]
            self.running[slot][1] = made + 1
            done = made + 1 == self.length
            rows.append({"episode_id": start.episode_id, "turn": made, "step": step,
                         "done": done, "cut": closes_batch and not done, "env_index": slot,
                         "replies": [{"step": step}]})  # what a batch is ordered by
            if done:
                ended.append(slot)
        for slot in ended:
            del self.running[slot]
        return rows, ended

    def play_out(self, engine, tokenizer, sampling, iteration, starts, progress):
        return play_in_lock_step(self, engine, tokenizer, sampling, iteration, starts, progress)

    def action_names(self):
        return []

    def state(self):
        return {"running": dict(self.running)}

    def load_state(self, state):
        self.running = dict(state.get("running", {}))
        return []  # no start made again

    def close(self):
        self.running = {}


SAMPLING = sampling_settings(seed=0)


def test_fixed_turn_batches_carry_episodes_over_and_restart_a_slot_at_once():
    player = ScriptedPlayer(n_slots=2, length=3)
    batches = FixedTurnBatches(player, ["goto", "open"], turns_per_env=2, seed=7, rank=1,
                               run_id="t")
    first = batches.collect(None, None, SAMPLING, 0, {"run_id": "t"}, progress=False)
    second = batches.collect(None, None, SAMPLING, 1, {"run_id": "t"}, progress=False)
    assert len(first) == len(second) == 4  # n_envs × turns_per_env, whatever the lengths
    assert [r["cut"] for r in first] == [False, False, True, True]
    assert [(r["episode_id"], r["turn"]) for r in second] == [
        ("t-r1-e2-0", 2), ("t-r1-e3-0", 2), ("t-r1-e2-1", 0), ("t-r1-e3-1", 0)]
    assert {r["iteration"] for r in second} == {1} and {r["group_id"] for r in second} == {None}
    assert [(s.slot, s.task) for s in player.started] == [(0, "goto"), (1, "open")] * 2
    assert player.started[2].seed == episode_seed(7, 1, 0, 1)  # (seed, rank, slot, count)


def test_a_failed_start_takes_the_slots_next_seed_and_a_resume_keeps_the_counters():
    player = ScriptedPlayer(n_slots=1, length=5, fail=("t-r0-e0-0",))
    batches = FixedTurnBatches(player, ["goto"], turns_per_env=2, seed=7, run_id="t")
    rows = batches.collect(None, None, SAMPLING, 0, progress=False)
    assert {r["episode_id"] for r in rows} == {"t-r0-e0-1"} and batches.episode_counts == [2]
    assert [r.get("aborted_resets") for r in rows] == [None, ["env_error"]]  # counted in it
    resumed = FixedTurnBatches(ScriptedPlayer(1, 5), ["goto"], 2, seed=7, run_id="t")
    resumed.load_state(batches.state())
    assert resumed.episode_counts == [2] and resumed.player.running == player.running
    with pytest.raises(SettingError, match="resume with the same rollout.n_envs"):
        FixedTurnBatches(ScriptedPlayer(2, 5), ["goto"], 2, seed=7).load_state(batches.state())


def test_groups_share_a_task_and_a_seed_and_play_to_the_end():
    player = ScriptedPlayer(n_slots=4, length=3)
    groups = EpisodeGroups(player, ["goto", "open"], 2, seed=7,
                           name=lambda slot, it: f"t-{it}-{slot}", run_id="t")
    rows = groups.collect(None, None, SAMPLING, 5, progress=False)
    assert len(rows) == 12 and not player.running  # every episode ended
    starts = player.started
    assert [s.task for s in starts] == ["goto", "goto", "open", "open"]
    assert starts[0].seed == starts[1].seed == episode_seed(7, 0, 0, 5) != starts[2].seed
    assert {r["group_id"] for r in rows if r["episode_id"] == "t-5-3"} == {"t-r0-i5-g1"}
    assert groups.state() == b""  # seeds follow from the iteration alone
    retried = EpisodeGroups(ScriptedPlayer(2, 2, fail=("r-1",)), ["goto"], None, seed=7,
                            name=lambda slot, it: f"r-{slot}")
    rows = retried.collect(None, None, SAMPLING, 0, progress=False)
    assert [(r["episode_id"], r.get("aborted_resets")) for r in rows] == [
        ("r-0", None), ("r-1", None), ("r-0", None), ("r-1", ["env_error"])]  # same seed again
    single = EpisodeGroups(ScriptedPlayer(2, 1), ["goto"], None, seed=7,
                           name=lambda slot, it: f"s-{slot}")
    assert single.starts(0)[1] == [None, None]
    assert len({s.seed for s in single.starts(0)[0]}) == 2
    with pytest.raises(SettingError, match="do not split into groups of 2"):
        EpisodeGroups(ScriptedPlayer(3, 1), ["goto"], 2, seed=7, name=lambda s, i: "x")
