"""Names and the model's context are checked before any work (issue 21): an unknown env, task,
engine or plugin, or a row longer than the model's positions, is one line, exit 2, and no model,
tokenizer, env or worker is ever made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import longturn.engines.registry as engines
import longturn.envs.registry as envs
import longturn.envs.workers as workers
import longturn.run.models as models
from components.common import parser, run
from longturn.params.config import parse_params
from longturn.errors import SettingError
from longturn.run.preflight import model_context, preflight

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_work(monkeypatch):
    """Every way a stage starts real work raises: a check that reaches one fails the test."""
    def forbidden(*args, **kwargs):
        raise AssertionError("work started before the params were checked")

    monkeypatch.setattr(models, "load_tokenizer", forbidden)
    monkeypatch.setattr(envs, "make_env", forbidden)
    monkeypatch.setattr(workers.WorkerEnv, "__init__", forbidden)
    monkeypatch.setattr(engines, "ENGINES", {name: forbidden for name in engines.ENGINES})
    import transformers
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", forbidden)


def refused(data: dict, model_dir: str | Path | None = None) -> str:
    with pytest.raises(SettingError) as err:
        preflight(parse_params(data, "p.yaml"), model_dir)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_the_shipped_params_pass(no_work):
    preflight(parse_params(yaml.safe_load((ROOT / "params.yaml").read_text())))


@pytest.mark.parametrize("data, says", [
    ({"eval": {"tasks": ["fly_to_moon"]}},
     "eval.tasks: env 'babyai' has no task 'fly_to_moon'; its tasks: goto, pickup"),
    ({"env": {"tasks": ["goto", "fly"]}}, "env.tasks: env 'babyai' has no task 'fly'"),
    ({"env": {"name": "crafter", "tasks": ["diamonds"], "kwargs": {}}},
     "env.tasks: env 'crafter' has no task 'diamonds'; its tasks: default"),
    ({"env": {"name": "nosuchenv"}}, "env.name: unknown env 'nosuchenv'"),
    ({"env": {"name": "nonexistent.module:factory"}},
     "env.name: env 'nonexistent.module:factory': cannot import module 'nonexistent.module'"),
    ({"env": {"name": "flaky_envs:NoSuchClass"}},
     "env.name: env 'flaky_envs:NoSuchClass': module 'flaky_envs' has no 'NoSuchClass'"),
    ({"engine": {"name": "vllm"}}, "engine.name 'vllm' is not one of ['hf', 'sglang']"),
])
def test_unknown_names_are_refused_before_any_work(no_work, data, says):
    assert says in refused(data)


def test_a_plugin_env_without_a_task_list_is_imported_and_left_to_check_its_tasks(no_work):
    preflight(parse_params({"env": {"name": "flaky_envs:FlakyCorridor", "tasks": ["any"],
                                    "kwargs": {}}}))


def test_conversation_tasks_and_plugins_are_looked_up_before_any_work(no_work, tmp_path):
    base = {"rollout": {"protocol": "chat"}, "env": {"tasks": ["arithmetic"]}}
    assert refused({**base, "eval": {"tasks": ["arithmetic", "riddles"]}}).startswith(
        "eval.tasks: 'riddles' is neither a built-in sequence task")
    assert refused({**base, "env": {"tasks": ["no.such.module:TASK"]}}).startswith(
        "env.tasks 'no.such.module:TASK': cannot import module 'no.such.module'")
    tools = tmp_path / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": [{"class": "longturn.tasks.calculator:Nope",
                                                "schema": {"type": "function", "function": {
                                                    "name": "calc", "description": "d",
                                                    "parameters": {"type": "object"}}}}]}))
    seq = {**base["rollout"], "chat": {"tools": str(tools)}}
    assert "has no 'Nope'" in refused({**base, "rollout": seq})
    seq = {**base["rollout"], "chat": {"function": "longturn.rollout.conversation_rollout:nope"}}
    assert "rollout.chat.function 'longturn.rollout.conversation_rollout:nope'" in refused({**base, "rollout": seq})


def model_dir_with(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_turn_longer_than_the_models_positions_is_refused(no_work, tmp_path):
    model = model_dir_with(tmp_path, {"max_position_embeddings": 1024})
    message = refused({"prompt": {"max_prompt_tokens": 1000},
                       "engine": {"sampling": {"max_new_tokens": 48}}}, model)
    assert message == ("prompt.max_prompt_tokens + engine.sampling.max_new_tokens (1,048) is over "
                       f"1,024: the positions of the model in {model} (config.json "
                       "max_position_embeddings)")
    preflight(parse_params({"prompt": {"max_prompt_tokens": 976},
                            "engine": {"sampling": {"max_new_tokens": 48}}}), model)


def test_a_sequence_budget_is_checked_against_a_vlms_text_config(no_work, tmp_path):
    model = model_dir_with(tmp_path, {"text_config": {"max_position_embeddings": 4096}})
    message = refused({"rollout": {"protocol": "chat", "chat": {"max_tokens": 8192}},
                       "env": {"tasks": ["arithmetic"]}}, model)
    assert message.startswith("rollout.chat.max_tokens (8,192) is over 4,096")


def test_model_context_reads_only_what_config_json_states(tmp_path):
    assert model_context(tmp_path) is None  # no config.json: the stage's model-dir check says so
    assert model_context(model_dir_with(tmp_path, {"n_positions": 1024})) == (1024, "n_positions")
    assert model_context(model_dir_with(tmp_path, {"model_type": "x"})) is None
    (tmp_path / "config.json").write_text("{broken")
    assert model_context(tmp_path) is None


def test_every_stage_runs_the_checks_before_its_body(no_work, tmp_path, capsys):
    """common.run with the checks (the stages that play envs pass them): the stage body is never
    reached; the line names the keys and the model."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    model = tmp_path / "model"
    model.mkdir()
    model_dir_with(model, {"max_position_embeddings": 512})
    p = parser("a stage")
    p.add_argument("--model-dir")

    def body(args, params):
        raise AssertionError("the stage body ran")

    argv = ["--params", str(path), "--model-dir", str(model)]
    assert run("some_stage", body, p, argv, checks=preflight) == 2
    err = capsys.readouterr().err.strip().splitlines()
    row = params["prompt"]["max_prompt_tokens"] + params["engine"]["sampling"]["max_new_tokens"]
    assert err == [f"some_stage: error: prompt.max_prompt_tokens + engine.sampling.max_new_tokens "
                   f"({row:,}) is over 512: the positions "
                   f"of the model in {model} (config.json max_position_embeddings)"]


@pytest.mark.parametrize("stage", ["zero_shot_eval", "final_eval"])
def test_an_eval_stage_refuses_an_unknown_task_before_loading_the_model(stage, no_work, tmp_path,
                                                                         monkeypatch, capsys):
    """The probe `eval.tasks: [fly_to_moon]` through the stage entry point: exit 2, one line that
    names the stage (final_eval runs zero_shot_eval's body under its own name)."""
    import importlib

    from components import zero_shot_eval
    entry = importlib.import_module(f"components.{stage}")

    def forbidden(*args, **kwargs):
        raise AssertionError("the stage reached its model")

    monkeypatch.setattr(zero_shot_eval, "check_model_dir", forbidden)
    monkeypatch.setattr(zero_shot_eval, "evaluate_model", forbidden)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["eval"]["tasks"] = ["fly_to_moon"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    out = tmp_path / "eval"
    assert entry.main(["--params", str(path), "--model-dir", str(tmp_path / "model"),
                       "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"{stage}: error: eval.tasks: env 'babyai' has no task 'fly_to_moon'")
    assert not out.exists()


def test_a_stage_that_finished_says_so_before_the_interpreter_tears_down(tmp_path, capsys,
                                                                           monkeypatch):
    """The line the GPU campaign reads to tell a finished stage from a hung one
    (bench/campaign/stages.py FINISHED); a refused stage does not print it."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from campaign.stages import FINISHED

    path = tmp_path / "params.yaml"
    path.write_text((ROOT / "params.yaml").read_text())
    argv = ["--params", str(path)]
    assert run("some_stage", lambda args, params: None, parser("a stage"), argv) == 0
    err = capsys.readouterr().err
    assert FINISHED.search(err) and err.strip().startswith("some_stage: finished in ")

    def refused_body(args, params):
        raise SettingError("a setting")

    assert run("some_stage", refused_body, parser("a stage"), argv) == 2
    assert not FINISHED.search(capsys.readouterr().err)
