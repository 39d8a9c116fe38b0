"""Every built-in env family through zero_shot_eval: real episodes with the tiny model, the same
Parquet and metrics as BabyAI's (env.name and env.tasks are the only switch)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from components import zero_shot_eval
from longturn.envs.registry import make_env
from reply_rows import reply_rows
from test_pipeline_smoke import toy_params, write_params


@pytest.mark.parametrize("name, task, kwargs", [
    ("crafter", "default", {"variant": "V"}),
    ("babaisai", "env/two_room-break_stop-make_win-distr_obj_rule", {}),
])
def test_zero_shot_eval_on_each_family(tmp_path, tiny_model_dir, name, task, kwargs):
    params = toy_params(tiny_model_dir)
    params["env"] = {"name": name, "tasks": [task], "kwargs": kwargs,
                     "invalid_action_penalty": 0.1, "max_turns": 3}
    params["prompt"].update(max_prompt_tokens=4000)  # + the reply within the model's 4,096
    params["eval"].update(tasks=[task], episodes_per_task=2, parallel_envs=2)
    path = write_params(tmp_path / "params.yaml", params)
    out = tmp_path / "eval"
    assert zero_shot_eval.main(["--params", path, "--model-dir", tiny_model_dir,
                                "--out", str(out)]) == 0
    turns = reply_rows(pd.read_parquet(out / "turns.parquet"))  # window samples: a reply each
    assert len(turns) == 6 and set(turns["task"]) == {task} and set(turns["env_name"]) == {name}
    actions = make_env(name, task, **kwargs).actions
    assert set(turns["action"]) <= set(actions)
    assert turns["prompt_text"].map(lambda text: all(a in text for a in actions)).all()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["overall"]["episodes"] == 2
