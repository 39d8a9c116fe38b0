"""Env failures: a raising, crashing or hanging env costs its episode (aborted, counted by reason,
out of the loss) and is restarted; the run goes on. Too many failures in a row stop the stage with
one line. Envs come from `tests/flaky_envs.py` (a plug-in, imported by the worker processes too).
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import pandas as pd
import pytest

from components import zero_shot_eval
from flaky_envs import FlakyCorridor
from longturn.algo.batches import read_sample_batch
from longturn.rollout.collection import FixedTurnBatches
from longturn.rollout.env_player import env_fixed_turns
from longturn.params.config import parse_params
from longturn.engines.base import Completion
from longturn.envs.failures import EnvFailure, EnvGaveUp
from longturn.envs.registry import EnvSpec
from longturn.envs.workers import WorkerEnv
from longturn.errors import UserError
from longturn.run.evaluation import env_plan, evaluate, write_outputs
from longturn.rollout.sample_metrics import sample_metrics as rollout_metrics
from longturn.run.models import load_tokenizer
from longturn.run.training import run_training
from reply_rows import replies_of, reply_rows
from settings_from_params import agent_settings, sampling_settings
from test_pipeline_smoke import write_params
from test_training import paths, toy_params

FLAKY = "flaky_envs:FlakyCorridor"
PID = re.compile(r"process (\d+)")


def worker(timeout_s: float | None = 1.0, **kwargs) -> WorkerEnv:
    return WorkerEnv(EnvSpec(FLAKY, "corridor", kwargs), timeout_s)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --------------------------------------------------------------------------- one worker


def test_hung_step_is_a_timeout_and_the_worker_is_replaced() -> None:
    env = worker(timeout_s=0.5, hang_on_step=2, hang_s=60)
    try:
        env.reset(seed=0)
        env.step("right")
        first = env.pid
        with pytest.raises(EnvFailure) as failure:
            env.step("right")
        assert failure.value.reason == "timeout" and "0.5 s" in failure.value.message
        assert not alive(first)  # killed, not left sleeping
        env.restart()
        obs, _ = env.reset(seed=0)
        assert env.pid != first and PID.search(obs.text).group(1) == str(env.pid)
        assert env.step("right")[0].text.startswith("You are 5 steps")
    finally:
        env.close()


def test_raise_and_crash_are_env_errors_with_the_cause() -> None:
    env = worker(raise_on_step=1)
    try:
        env.reset(seed=0)
        with pytest.raises(EnvFailure) as failure:
            env.step("right")
        assert failure.value.reason == "env_error"
        assert "step 1 is broken" in failure.value.message
        assert "Traceback" in failure.value.details
    finally:
        env.close()
    env = worker(hang_on_step=1)
    try:
        env.reset(seed=0)
        env.submit_step("right")
        os.kill(env.pid, 9)  # the worker crashes mid-step
        with pytest.raises(EnvFailure, match="worker died during step") as failure:
            env.wait_step()
        assert failure.value.reason == "env_error"
    finally:
        env.close()


def test_a_pickled_worker_env_continues_its_episode() -> None:
    env = worker()
    env.reset(seed=0)
    env.step("right")
    copy = pickle.loads(pickle.dumps(env))  # what a checkpoint does
    try:
        a, b = env.step("right")[0].text, copy.step("right")[0].text
        assert PID.sub("", a) == PID.sub("", b) and copy.pid != env.pid
        assert copy.actions == ["left", "right"] and copy.instructions.goal.startswith("reach")
    finally:
        env.close()
        copy.close()


def test_an_env_that_cannot_be_built_names_env_and_task() -> None:
    env = worker(no_such_kwarg=1)
    with pytest.raises(ValueError, match=r"env 'flaky_envs:FlakyCorridor' task 'corridor'.*"
                                         r"no_such_kwarg"):
        env.actions


# --------------------------------------------------------------------------- slots


class ScriptedEngine:
    """Always answers 'ACTION: right' (no model: these tests are about envs)."""

    def __init__(self, tokenizer) -> None:
        self.ids = tokenizer("THINK: on.\nACTION: right", add_special_tokens=False)["input_ids"]

    def generate(self, prompts, sampling):
        return [Completion(list(self.ids), [0.0] * len(self.ids), "stop") for _ in prompts]


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


def collector(factory, max_retries: int = 3, n_envs: int = 2) -> FixedTurnBatches:
    settings = agent_settings(max_turns=3, max_prompt_tokens=2048, max_retries=max_retries)
    return env_fixed_turns(factory, ["corridor"], n_envs=n_envs, turns_per_env=4,
                           settings=settings, seed=1, run_id="t")


def test_a_raising_step_aborts_its_episode_and_is_counted(tokenizer) -> None:
    """In process: slot 0's env raises on its 2nd step; slot 1 runs into max_turns."""
    envs = [FlakyCorridor(raise_on_step=2), FlakyCorridor()]
    c = collector(lambda task: envs.pop(0))
    samples = c.collect(ScriptedEngine(tokenizer), tokenizer, sampling_settings(), iteration=0,
                        progress=False)
    slot0 = [r for r in replies_of(samples) if r["env_index"] == 0]
    assert [r["aborted"] for r in slot0] == [False, True, False, False]
    assert slot0[1]["termination"] == "env_error" and slot0[1]["reward"] == 0.0
    assert slot0[2]["turn"] == 0 and slot0[2]["episode_id"] != slot0[1]["episode_id"]
    m = rollout_metrics(samples)
    assert m["episodes_aborted"] == 1 and m["termination/env_error"] == 1
    assert m["termination/time_limit"] == 1  # slot 1: three turns, then max_turns
    assert m["episodes_ended"] == 2 and m["success_rate"] == 0.0  # of the one completed episode


class ResetsFailAfterFirst(FlakyCorridor):
    """Its first reset works; the next `failing` resets raise."""

    def __init__(self, failing: int):
        super().__init__()
        self.resets, self.failing = 0, failing

    def reset(self, seed=None):
        self.resets += 1
        if 1 < self.resets <= 1 + self.failing:
            raise RuntimeError(f"reset {self.resets} is broken")
        return super().reset(seed)


def test_failed_resets_are_counted_in_their_batch(tokenizer) -> None:
    c = collector(lambda task: ResetsFailAfterFirst(failing=2), n_envs=1)
    samples = c.collect(ScriptedEngine(tokenizer), tokenizer, sampling_settings(), iteration=0,
                        progress=False)
    rows = replies_of(samples)
    assert rows[2]["truncated"] and rows[3]["aborted_resets"] == ["env_error", "env_error"]
    assert [r.get("aborted_resets") for r in rows[:3]] == [None] * 3
    assert rows[3]["turn"] == 0 and c.episode_counts == [4]  # two seeds lost, the third runs
    m = rollout_metrics(samples)
    assert (m["episodes_ended"], m["episodes_aborted"], m["termination/env_error"]) == (3, 2, 2)


def test_more_than_max_retries_failures_in_a_row_stop_with_one_line(tokenizer) -> None:
    c = collector(lambda task: ResetsFailAfterFirst(failing=10), n_envs=1)
    with pytest.raises(EnvGaveUp) as gave_up:
        c.collect(ScriptedEngine(tokenizer), tokenizer, sampling_settings(), iteration=0,
                  progress=False)
    message = str(gave_up.value)
    assert isinstance(gave_up.value, UserError) and "\n" not in message
    assert "env 'flaky' task 'corridor' failed 4 times in a row" in message
    assert f"seed {c.player.slots[0].seed}" in message and "reset 5 is broken" in message
    assert "env.max_retries is 3" in message


class FirstStepFails(FlakyCorridor):
    """Every episode's first step raises (the same env goes on after a failure: it was handed
    in built)."""

    def reset(self, seed=None):
        self.stepped = False
        return super().reset(seed)

    def step(self, action):
        if not self.stepped:
            self.stepped = True
            raise RuntimeError("the first step is broken")
        return super().step(action)


def test_a_reset_that_works_does_not_clear_the_failures_in_a_row(tokenizer) -> None:
    """Every episode resets, then its first step raises: the slot's 3rd episode stops the
    stage (the chat protocol's env interaction counts the same way:
    tests/test_env_interaction_faults.py)."""
    c = collector(lambda task: FirstStepFails(), max_retries=2, n_envs=1)
    with pytest.raises(EnvGaveUp, match=r"failed 3 times in a row, the last on seed \d+ "
                                        r"\(step, env_error: .*env.max_retries is 2"):
        c.collect(ScriptedEngine(tokenizer), tokenizer, sampling_settings(), iteration=0,
                  progress=False)


# --------------------------------------------------------------------------- stages


def flaky_env(**kwargs) -> dict:
    return {"name": FLAKY, "tasks": ["corridor"], "kwargs": kwargs, "max_turns": 4,
            "step_timeout_s": 1.0}


def test_training_goes_on_past_a_hanging_env(tmp_path, tiny_model_dir) -> None:
    """Each slot's env hangs on its 3rd step: the run finishes, those turns are aborted (timeout),
    counted, out of the loss, and the slot's next turn comes from a new worker process."""
    params = toy_params(tiny_model_dir, 1).model_dump()
    params["env"] = flaky_env(hang_on_step=3, hang_s=60)
    params["rollout"]["turns_per_env"] = 4
    params["ppo"].update(mini_batch_size=8, micro_batch_size=4)
    (metrics,) = run_training(parse_params(params), paths(tmp_path, tiny_model_dir),
                              progress=False)
    assert metrics["termination/timeout"] == 2 and metrics["episodes_aborted"] == 2
    assert metrics["termination/env_error"] == 0
    part = tmp_path / "trajectories/iteration=0000/part-00.parquet"
    frame = reply_rows(pd.read_parquet(part))  # window samples: one reply each
    assert frame.loc[frame["aborted"], "step"].tolist() == [2, 2]  # the 3rd step of each env
    assert frame.loc[frame["aborted"], "termination"].tolist() == ["timeout", "timeout"]
    batch = read_sample_batch([part])
    kept = sum(len(r) for r, a in zip(frame["response_ids"], frame["aborted"]) if not a)
    assert batch.n_tokens(range(len(batch))) == kept  # aborted turns carry no loss token
    for _, slot in frame.groupby("env_index"):
        pids = [PID.search(text).group(1) for text in slot.sort_values("step")["prompt_text"]]
        assert pids[0] == pids[2] != pids[3]  # the hung worker was replaced
    assert (tmp_path / "final/config.json").is_file()


def eval_params(model_dir: str, **env_kwargs) -> dict:
    params = toy_params(model_dir, 1).model_dump()
    params["env"] = {**flaky_env(**env_kwargs), "max_turns": 2}
    params["eval"].update(tasks=["corridor"], episodes_per_task=4, parallel_envs=2, seed=1000)
    return params


def test_eval_counts_aborted_episodes_apart(tmp_path, tiny_model_dir) -> None:
    """Seed 1001's reset raises; the env hangs on its 3rd step (the 1st turn of seed 1003)."""
    from longturn.engines.hf import HFEngine

    params = parse_params(eval_params(tiny_model_dir, raise_on_reset=[1001], hang_on_step=3))
    engine = HFEngine(tiny_model_dir, dtype="float32")
    try:
        metrics = evaluate(env_plan, engine, load_tokenizer(tiny_model_dir), params, tmp_path,
                           "base", progress=False)
    finally:
        engine.close()
    episodes = pd.read_parquet(tmp_path / "episodes.parquet").set_index("episode_seed")
    assert episodes["aborted"].to_dict() == {1000: False, 1001: True, 1002: False, 1003: True}
    assert episodes.loc[1001, "length"] == 0 and episodes.loc[1003, "length"] == 1
    overall = json.loads((tmp_path / "metrics.json").read_text())["overall"]
    assert overall == metrics["overall"]
    assert (overall["episodes"], overall["aborted_episodes"], overall["completed_episodes"]) \
        == (4, 2, 2)
    assert overall["success_denominator"] == "completed_episodes"
    assert {k: overall[f"termination/{k}"] for k in ("success", "failure", "time_limit",
                                                      "env_error", "timeout")} \
        == {"success": 0, "failure": 0, "time_limit": 2, "env_error": 1, "timeout": 1}
    assert overall["mean_length"] == 2.0  # over the completed episodes only
    assert episodes["termination"].to_dict() == {1000: "time_limit", 1001: "env_error",
                                                 1002: "time_limit", 1003: "timeout"}
    turns = reply_rows(pd.read_parquet(tmp_path / "turns.parquet"))
    assert len(turns) == 5 and turns["aborted"].sum() == 1


def test_eval_stage_stops_with_one_line_when_an_env_keeps_failing(tmp_path, tiny_model_dir,
                                                                  capsys) -> None:
    params = eval_params(tiny_model_dir, raise_on_reset="all")
    params["env"]["max_retries"] = 1
    path = write_params(tmp_path / "params.yaml", params)
    code = zero_shot_eval.main(["--params", path, "--model-dir", tiny_model_dir,
                                "--out", str(tmp_path / "eval")])
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after progress bars and warnings
    assert code == 2
    assert last.startswith("zero_shot_eval: error: env 'flaky' task 'corridor' failed 2 times")
    assert "seed 1002" in last and "env.max_retries is 1" in last


def test_a_failed_write_keeps_the_outputs_written_before_it(tmp_path, monkeypatch) -> None:
    import longturn.run.evaluation as evaluation

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(evaluation, "write_samples", full_disk)
    episodes = [{"task": "t", "episode_seed": 1, "success": True, "length": 1, "return": 1.0,
                 "env_return": 1.0, "valid_actions": 1, "aborted": False}]
    metrics = evaluation.metrics_by_task(episodes, ["t"])
    with pytest.raises(OSError, match="No space"):
        write_outputs(tmp_path, metrics, episodes, [{"task": "t"}], {})
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    assert len(pd.read_parquet(tmp_path / "episodes.parquet")) == 1
    assert not Path(tmp_path / "turns.parquet").exists()
