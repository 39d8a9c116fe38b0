"""Crafter through the stages: zero_shot_eval plays real crafter episodes with the tiny model and
writes the same Parquet and metrics as for BabyAI (env.name is the only switch)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from components import zero_shot_eval
from test_pipeline_smoke import toy_params, write_params

pytestmark = pytest.mark.smoke


def test_zero_shot_eval_on_crafter(tmp_path, tiny_model_dir):
    params = toy_params(tiny_model_dir)
    params["env"] = {"name": "crafter", "tasks": ["default"], "kwargs": {"variant": "V"},
                     "invalid_action_penalty": 0.1, "max_turns": 3}
    params["prompt"].update(max_prompt_tokens=4096)
    params["eval"].update(tasks=["default"], episodes_per_task=2, parallel_envs=2)
    path = write_params(tmp_path / "params.yaml", params)
    out = tmp_path / "eval"
    assert zero_shot_eval.main(["--params", path, "--model-dir", tiny_model_dir,
                                "--out", str(out)]) == 0
    turns = pd.read_parquet(out / "turns.parquet")
    assert len(turns) == 6 and set(turns["task"]) == {"default"}
    assert turns["prompt_text"].str.contains("Move West").all()  # the action list reached the prompt
    assert set(turns["action"]) <= {"Noop", "Move West", "Move East", "Move North", "Move South",
                                    "Do", "Sleep", "Place Stone", "Place Table", "Place Furnace",
                                    "Place Plant", "Make Wood Pickaxe", "Make Stone Pickaxe",
                                    "Make Iron Pickaxe", "Make Wood Sword", "Make Stone Sword",
                                    "Make Iron Sword"}
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["overall"]["episodes"] == 2
