"""Stages on `engine.name: sglang`: the train stage launches its server, pushes each update's actor
to it, and stops it; zero_shot_eval runs on it. The server is the test stand-in (no GPU here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

from conftest import free_port
from test_train_stage import ROOT, train_cmd, write_params


def use_sglang(params_path: str) -> None:
    """The stand-in on a free port, logging beside the params file (never the system tmp)."""
    params = yaml.safe_load(Path(params_path).read_text())
    params["engine"]["name"] = "sglang"
    params["engine"]["sglang"] = {"python": sys.executable, "port": free_port(),
                                  "startup_timeout_s": 120,
                                  "log_dir": str(Path(params_path).parent / "sglang_logs")}
    params["eval"] = {"episodes_per_task": 2, "parallel_envs": 2}
    Path(params_path).write_text(yaml.safe_dump(params))


def test_train_and_eval_stages_on_sglang(standin_env, tiny_model_dir, tmp_path):
    params = write_params(tmp_path, tiny_model_dir, iterations=2)
    use_sglang(params)
    out = tmp_path / "train"
    done = subprocess.run(train_cmd(params, tiny_model_dir, out), cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for iteration in range(2):
        turns = pd.read_parquet(out / f"trajectories/iteration={iteration:04d}/part-00.parquet")
        assert len(turns) == 6 and turns["response_ids"].map(len).min() >= 1
    sent = [json.loads(line) for line in standin_env.read_text().splitlines()]
    updates = [s["body"]["model_path"] for s in sent if s["route"] == "/update_weights_from_disk"]
    assert updates == [str((out / "policy").resolve())] * 2  # after each of the 2 updates

    evaluated = subprocess.run(
        [sys.executable, "components/zero_shot_eval.py", "--params", params, "--model-dir",
         str(out / "final"), "--out", str(tmp_path / "eval")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval/metrics.json").read_text())
    assert metrics["overall"]["episodes"] == 2
    assert len(list((tmp_path / "sglang_logs").glob("sglang-*.log"))) == 2  # train's, eval's


def test_a_stage_that_cannot_launch_sglang_says_which_setting(tmp_path, tiny_model_dir):
    params = write_params(tmp_path, tiny_model_dir, iterations=1)
    use_sglang(params)
    data = yaml.safe_load(Path(params).read_text())
    data["engine"]["sglang"]["python"] = "/nonexistent/bin/python"
    Path(params).write_text(yaml.safe_dump(data))
    done = subprocess.run(
        [sys.executable, "components/zero_shot_eval.py", "--params", params, "--model-dir",
         tiny_model_dir, "--out", str(tmp_path / "eval")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "zero_shot_eval: error: engine.sglang.python '/nonexistent/bin/python'" in done.stderr
    assert "Traceback" not in done.stderr
