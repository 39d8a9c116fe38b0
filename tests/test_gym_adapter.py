"""A plain gymnasium.Env runs as a text env from `env.name: module:Class`, no wrapper written:
Discrete actions by name, Text actions as written, text / dict / ansi observations, rgb frames."""

from __future__ import annotations

import json

import numpy as np
import pytest

from components import zero_shot_eval
from longturn.envs.gym_adapter import FREE_TEXT_LABEL, GymTextEnv
from longturn.envs.registry import make_env, translator_for
from reply_rows import read_reply_rows
from test_pipeline_smoke import toy_params, write_params

CORRIDOR = "flaky_envs:GymCorridor"


def test_discrete_actions_by_name_and_text_observations() -> None:
    env = make_env(CORRIDOR, "default", length=3)
    assert isinstance(env, GymTextEnv) and env.name == CORRIDOR and env.task == "default"
    assert env.actions == ["west", "east"] and env.default_action == "west"
    obs, _ = env.reset(seed=0)
    assert obs.text.startswith("The exit is") and obs.image is None
    shown = env.instructions
    assert shown.goal == "Walk east to the exit of a corridor"  # the class docstring
    assert shown.actions == {"west": "one step back", "east": "one step towards the exit"}
    translator = translator_for(env)
    assert translator.parse("THINK: go.\nACTION: East").action == "east"
    done = False
    for _ in range(3):
        obs, reward, done, truncated, info = env.step("east")
    assert done and reward == 1.0 and info["success"] is True  # from info["is_success"]


def test_ansi_text_and_rgb_frames() -> None:
    env = make_env(CORRIDOR, "default", text_obs=False, render_mode="ansi")
    obs, _ = env.reset(seed=1)
    assert obs.text.startswith("The exit is")
    env = make_env(CORRIDOR, "default", render_mode="rgb_array")
    obs, _ = env.reset(seed=1)
    assert obs.text.startswith("The exit is") and obs.image.shape == (4, 16, 3)
    with pytest.raises(ValueError, match="not text"):
        make_env(CORRIDOR, "default", text_obs=False).reset(seed=0)


def test_text_action_space_takes_the_action_as_written() -> None:
    env = make_env("flaky_envs:GymShout", "door")
    assert env.actions == [] and env.instructions.goal == "say the magic word"
    assert list(env.instructions.actions) == [FREE_TEXT_LABEL]
    translator = translator_for(env)
    spoken = translator.parse("THINK: try it.\nACTION: `open sesame`")
    assert spoken.valid and spoken.action == "open sesame"
    shouted = translator.parse("ACTION: OPEN SESAME!")  # not in the space's charset
    assert not shouted.valid and shouted.action == "hello" and shouted.failure == "unknown_action"
    env.reset(seed=0)
    assert env.step(spoken.action)[2] is True
    assert env.step("hello")[0].text == "The door heard 'hello'."


def test_discrete_space_without_names_is_a_clear_error(monkeypatch) -> None:
    import flaky_envs

    monkeypatch.setattr(flaky_envs.GymCorridor, "action_names", None)
    with pytest.raises(ValueError, match="no action names"):
        make_env(CORRIDOR, "default")


def test_minigrid_env_names_its_actions_from_its_enum() -> None:
    from minigrid.envs import EmptyEnv

    base = EmptyEnv(size=5)
    env = GymTextEnv(base, "minigrid", "empty")
    assert env.actions[:3] == ["left", "right", "forward"]
    assert len(env.actions) == base.action_space.n


def test_zero_shot_eval_on_a_gymnasium_env(tmp_path, tiny_model_dir) -> None:
    params = toy_params(tiny_model_dir)
    params["env"].update(name=CORRIDOR, tasks=["default"], kwargs={"length": 2}, max_turns=3,
                         step_timeout_s=30.0)
    params["eval"].update(tasks=["default"], episodes_per_task=2, parallel_envs=2)
    path = write_params(tmp_path / "params.yaml", params)
    out = tmp_path / "eval"
    assert zero_shot_eval.main(["--params", path, "--model-dir", tiny_model_dir,
                                "--out", str(out)]) == 0
    turns = read_reply_rows(out / "turns.parquet")
    assert set(turns["env_name"]) == {CORRIDOR} and set(turns["action"]) <= {"west", "east"}
    assert turns["prompt_text"].str.contains("east: one step towards the exit").all()
    metrics = json.loads((out / "metrics.json").read_text())["overall"]
    assert metrics["episodes"] == 2 and metrics["aborted_episodes"] == 0
    assert sum(metrics[f"termination/{r}"] for r in ("success", "failure", "time_limit")) == 2
    assert np.isclose(metrics["success_rate"], metrics["successes"] / 2)
