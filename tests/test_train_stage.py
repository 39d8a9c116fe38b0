"""The train stage as a user runs it: SIGKILL mid-run then rerun, and replay of one iteration."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]


def write_params(tmp_path: Path, model_dir: str, iterations: int) -> str:
    params = {
        "seed": 5,
        "model": {"source": model_dir, "dtype": "float32"},
        "env": {"tasks": ["goto"], "max_turns": 4},
        "engine": {"batch_size": 4, "sampling": {"max_new_tokens": 5, "temperature": 1.0}},
        "rollout": {"n_envs": 2, "turns_per_env": 3},
        "ppo": {"mini_batch_size": 6, "micro_batch_size": 3, "bf16": False, "lora": True},
        "train": {"iterations": iterations, "checkpoint_every": 1, "keep_checkpoints": 2},
    }
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return str(path)


def train_cmd(params: str, model_dir: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "components/train.py", "--params", params, "--model-dir", model_dir,
            "--critic-dir", model_dir, "--out", str(out), *extra]


def test_sigkill_then_rerun_loses_and_duplicates_nothing(tmp_path, tiny_model_dir):
    params = write_params(tmp_path, tiny_model_dir, iterations=4)
    out = tmp_path / "train"
    temp = tmp_path / "tmp"  # the stages' temp dir: what the kill leaves there is checked below
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    proc = subprocess.Popen(train_cmd(params, tiny_model_dir, out), cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 300
    # kill once iteration 1 has written its Parquet: its update/checkpoint may not have happened
    while not list(out.glob("trajectories/iteration=0001/part-*.parquet")):
        assert proc.poll() is None, "train stage ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert list(temp.glob("longturn-dist-*"))  # atexit never ran
    done = subprocess.run(train_cmd(params, tiny_model_dir, out), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(temp.glob("longturn-dist-*"))  # the rerun swept the killed one's dir
    iterations = sorted(d.name for d in (out / "trajectories").iterdir())
    assert iterations == [f"iteration={i:04d}" for i in range(4)]
    for d in iterations:
        assert [p.name for p in (out / "trajectories" / d).iterdir()] == ["part-00.parquet"]
        assert len(pd.read_parquet(out / "trajectories" / d / "part-00.parquet")) == 6
    steps = pd.read_csv(out / "live/plots/metrics/train/policy_loss.tsv", sep="\t")["step"]
    assert list(steps) == [0, 1, 2, 3]
    assert not list((out / "trajectories").rglob("*tmp*"))  # no partial Parquet files
    assert (out / "final/config.json").is_file()

    replay = subprocess.run(train_cmd(params, tiny_model_dir, out, "--replay",
                                      str(out / "trajectories/iteration=0003")),
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert replay.returncode == 0, replay.stderr[-3000:]
    metrics = json.loads(replay.stdout.strip().splitlines()[-1])
    assert metrics["n_turns"] == 6 and "policy_loss" in metrics
