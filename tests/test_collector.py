"""Fixed-turn collection of the action protocol (an env's episodes as conversations of its
interaction): exact batch size, episodes continuing across iterations, bootstrap prompts; what
is collected is samples of one reply each, read here reply by reply."""

import os
import time
from collections import defaultdict

import pytest

from longturn.engines.hf import HFEngine
from longturn.params.config import parse_params
from longturn.rollout.conversation_player import conversation_fixed_turns
from longturn.rollout.conversation_setup import ConversationRun
from longturn.run.models import load_tokenizer
from reply_rows import replies_of
from settings_from_params import sampling_settings

SAMPLING = sampling_settings(max_new_tokens=4, temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = HFEngine(tiny_model_dir, dtype="float32")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def make_collector(max_turns=3, workers=False, n_envs=3):
    params = parse_params({"env": {"tasks": ["goto", "open"], "max_turns": max_turns,
                                   "workers": workers, "step_timeout_s": 60.0 if workers else None},
                           "prompt": {"max_prompt_tokens": 2048}})
    return conversation_fixed_turns(ConversationRun.of_env(params, progress=False),
                                    ["goto", "open"], n_envs=n_envs, turns_per_env=4, seed=11,
                                    run_id="t")


def worker_pids(collector) -> set[int]:
    """The worker processes of the collector's running episodes' envs."""
    instances = collector.player.run.settings.interaction.instances.values()
    return {state["env"].pid for state in instances}


def played(collector, engine, tokenizer, iteration):
    """One collect, reply by reply."""
    return replies_of(collector.collect(engine, tokenizer, SAMPLING, iteration, progress=False))


KEYS = ("episode_id", "turn", "prompt_ids", "response_ids", "action", "reward", "termination")


def test_fixed_turn_batches_continue_episodes(engine, tokenizer):
    collector = make_collector()
    first = played(collector, engine, tokenizer, 0)
    second = played(collector, engine, tokenizer, 1)
    assert len(first) == len(second) == 12
    crossing = 0
    by_slot = defaultdict(list)
    for row in first + second:
        by_slot[row["env_index"]].append(row)
    for rows in by_slot.values():
        assert [r["step"] for r in rows] == [0, 1, 2, 3] * 2
        assert [r["segment_end"] for r in rows] == [False, False, False, True] * 2
        assert rows[0]["turn"] == 0
        for prev, row in zip(rows, rows[1:]):
            if prev["terminated"] or prev["truncated"]:  # a new episode starts in the slot
                assert row["turn"] == 0 and row["episode_id"] != prev["episode_id"]
                assert row["episode_seed"] != prev["episode_seed"]
            else:  # the same episode goes on, across the iteration boundary too
                assert row["turn"] == prev["turn"] + 1 and row["episode_id"] == prev["episode_id"]
            assert row["turn"] < 3  # max_turns
        crossing += rows[3]["episode_id"] == rows[4]["episode_id"]
        for r in rows:
            wants = r["truncated"] or (r["segment_end"] and not r["terminated"])
            assert (r["bootstrap_prompt_ids"] is not None) == wants
    assert crossing >= 1  # some episode continued from iteration 0 into iteration 1
    assert any(r["truncated"] for r in first + second)
    tasks = {r["env_index"]: r["task"] for r in first}
    assert tasks == {0: "goto", 1: "open", 2: "goto"}


def test_state_roundtrip_continues_identically(engine, tokenizer):
    a = make_collector()
    played(a, engine, tokenizer, 0)
    b = make_collector()
    b.load_state(a.state())
    rows_a = played(a, engine, tokenizer, 1)
    rows_b = played(b, engine, tokenizer, 1)
    assert [[r[k] for k in KEYS] for r in rows_a] == [[r[k] for k in KEYS] for r in rows_b]


def test_worker_envs_play_the_same_turns_and_resume_from_a_checkpoint(engine, tokenizer):
    """Envs in worker processes give the rows envs in this process give; a collector state
    (each worker pickles its env) continues the same episodes in new workers."""
    local, remote = make_collector(n_envs=2), make_collector(workers=True, n_envs=2)
    resumed = None
    try:
        rows_l = played(local, engine, tokenizer, 0)
        rows_r = played(remote, engine, tokenizer, 0)
        assert [[r[k] for k in KEYS] for r in rows_l] == [[r[k] for k in KEYS] for r in rows_r]
        assert any(r["termination"] == "time_limit" for r in rows_r)
        resumed = make_collector(workers=True, n_envs=2)
        resumed.load_state(remote.state())
        pids = worker_pids(remote)
        assert len(pids) == 2 and not pids & worker_pids(resumed)
        rows_r = played(remote, engine, tokenizer, 1)
        rows_c = played(resumed, engine, tokenizer, 1)
        assert [[r[k] for k in KEYS] for r in rows_r] == [[r[k] for k in KEYS] for r in rows_c]
        pids = worker_pids(resumed) | idle_worker_pids(resumed)
    finally:
        for c in (local, remote, resumed):
            if c is not None:
                c.close()
    time.sleep(0.5)
    assert not [pid for pid in pids if alive(pid)]  # closing the collector stopped its workers


def idle_worker_pids(collector) -> set[int]:
    """The worker processes of the envs the collector's interaction keeps for later episodes."""
    return {env.pid for idle in collector.player.run.settings.interaction._idle.values()
            for env in idle}


def alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # a child that exited is reaped, not counted
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class _NoPlayer:
    """Slots enough for a collector that only loads a checkpoint."""

    n_slots = 2

    def load_state(self, state) -> list:
        del state
        return []


def test_a_checkpoint_written_by_other_code_is_one_line() -> None:
    """Running episodes are pickled with their classes: a class this code lacks is named, with
    what to do, instead of an unpickling traceback."""
    from longturn.errors import SettingError
    from longturn.rollout.collection import FixedTurnBatches

    batches = FixedTurnBatches(_NoPlayer(), ["goto"], 2, seed=0)
    with pytest.raises(SettingError, match="ModuleNotFoundError.*another version of longturn"):
        batches.load_state(b"clongturn.no_such_module\nSlot\n.")
    batches.load_state(b"")  # no checkpoint: nothing to restore
    assert batches.episode_counts == [0, 0]
