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
from longturn.algo.batches import read_sample_batch
from longturn.params.config import parse_params
from longturn.envs.failures import EnvFailure
from longturn.envs.registry import EnvSpec
from longturn.envs.workers import WorkerEnv
from longturn.run.evaluation import env_plan, evaluate, write_outputs
from longturn.run.models import load_tokenizer
from longturn.run.training import run_training
from longturn.trajectories import SAMPLE_SCHEMA
from reply_rows import reply_rows
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
# A slot's env failures (a raising step, failed resets counted in their batch, failures in a row
# that stop the stage, a reset that does not clear them) are played by conversations of the env:
# tests/test_env_interaction_faults.py.


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

    monkeypatch.setattr(evaluation, "write_arrow", full_disk)
    episodes = [{"task": "t", "episode_seed": 1, "success": True, "length": 1, "return": 1.0,
                 "env_return": 1.0, "valid_actions": 1, "aborted": False}]
    metrics = evaluation.metrics_by_task(episodes, ["t"])
    with pytest.raises(OSError, match="No space"):
        write_outputs(tmp_path, metrics, episodes, SAMPLE_SCHEMA.empty_table(), {})
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    assert len(pd.read_parquet(tmp_path / "episodes.parquet")) == 1
    assert not Path(tmp_path / "turns.parquet").exists()
