"""Fixed-turn collection: exact batch size, episodes continuing across iterations, bootstrap
prompts; what is collected is samples of one reply each, read here reply by reply."""

from collections import defaultdict

import pytest

from longturn.rollout.env_player import env_fixed_turns
from longturn.engines.hf import HFEngine
from longturn.envs.babyai import BabyAITextEnv
from longturn.envs.registry import EnvSpec
from longturn.envs.workers import WorkerEnv
from longturn.run.models import load_tokenizer
from reply_rows import replies_of
from settings_from_params import agent_settings, sampling_settings

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
    settings = agent_settings(max_turns=max_turns, max_prompt_tokens=2048)
    factory = ((lambda task: WorkerEnv(EnvSpec("babyai", task), timeout_s=60.0)) if workers
               else (lambda task: BabyAITextEnv(task)))
    return env_fixed_turns(factory, ["goto", "open"], n_envs=n_envs, turns_per_env=4,
                           settings=settings, seed=11, run_id="t")


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
        pids = {slot.env.pid for slot in remote.player.slots}
        assert not pids & {slot.env.pid for slot in resumed.player.slots}
        rows_r = played(remote, engine, tokenizer, 1)
        rows_c = played(resumed, engine, tokenizer, 1)
        assert [[r[k] for k in KEYS] for r in rows_r] == [[r[k] for k in KEYS] for r in rows_c]
    finally:
        for c in (local, remote, resumed):
            if c is not None:
                c.close()


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
