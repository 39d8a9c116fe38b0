"""params.yaml validation: unknown keys, wrong types and impossible values name the key."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from longturn.params.config import ParamsError, load_params, parse_params

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_params_are_valid():
    params = load_params(ROOT / "params.yaml")
    assert params.eval.tasks


def test_defaults_fill_eval_tasks():
    params = parse_params({"env": {"tasks": ["goto", "open"]}})
    assert params.eval.tasks == ["goto", "open"]


@pytest.mark.parametrize(
    "data, key",
    [
        ({"eval": {"episodes_per_tsk": 3}}, "eval.episodes_per_tsk"),
        ({"bogus": 1}, "bogus"),
        ({"eval": {"episodes_per_task": "many"}}, "eval.episodes_per_task"),
        ({"eval": {"episodes_per_task": -2}}, "eval.episodes_per_task"),
        ({"engine": {"sampling": {"top_p": 0}}}, "engine.sampling.top_p"),
        ({"validation": {"min_valid_action_ratio": 1.5}}, "validation.min_valid_action_ratio"),
        ({"prompt": {"history_content": "everything"}}, "prompt.history_content"),
        ({"env": {"tasks": []}}, "env.tasks"),
    ],
)
def test_errors_name_the_key(data, key):
    with pytest.raises(ParamsError) as err:
        parse_params(data, "p.yaml")
    assert f"'{key}'" in str(err.value)
    assert str(err.value).startswith("p.yaml")


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ParamsError, match="not found"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("eval: [unclosed")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)
    bad.write_text("- a list")
    with pytest.raises(ParamsError, match="mapping"):
        load_params(bad)


@pytest.mark.parametrize("stage", ["prepare_model", "validate_prompts", "zero_shot_eval"])
def test_stage_stops_before_work_with_one_line(tmp_path, stage):
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["eval"]["episodes_per_task"] = -1
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, f"components/{stage}.py", "--params", str(path), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "eval.episodes_per_task" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("data,key", [
    ({"rollout": {"n_envs": True}}, "rollout.n_envs"),        # a bool is not a count
    ({"ppo": {"lora": 1}}, "ppo.lora"),                       # an int is not a bool
    ({"eval": {"episodes_per_task": 8.0}}, "eval.episodes_per_task"),
    ({"eval": {"tasks": []}}, "eval.tasks"),                  # empty: an error, not env.tasks
])
def test_types_are_strict_and_an_empty_task_list_is_an_error(data, key):
    with pytest.raises(ParamsError) as err:
        parse_params(data, "p.yaml")
    assert f"'{key}'" in str(err.value)


def test_ints_stay_valid_floats_and_null_tasks_mean_the_training_tasks():
    params = parse_params({"ppo": {"actor_lr": 1}, "eval": {"tasks": None}})
    assert params.ppo.actor_lr == 1.0 and params.eval.tasks == params.env.tasks
