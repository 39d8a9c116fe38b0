"""The Kubeflow pipeline: compiled from the GPU profile (segments, GPUs, retries, image), run whole
with kfp.local at toy size (every task here, in this interpreter), and submit's errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import free_port
from pipeline.build import segment_ends
from test_pipeline_smoke import ROOT, toy_params, write_params


def pipeline_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.parametrize("iterations, per_task, ends", [
    (5, 2, [2, 4, 5]), (4, 1, [1, 2, 3, 4]), (3, 10, [3]), (200, 10, list(range(10, 201, 10)))])
def test_segment_ends(iterations, per_task, ends):
    assert segment_ends(iterations, per_task) == ends


def test_gpu_profile_compiles_to_chained_segments_on_gpus(tmp_path):
    out = tmp_path / "longturn.yaml"
    done = pipeline_cli("compile", "--params", "params-gpu.yaml", "--out", str(out),
                        "--image", "registry.example/longturn:1")
    assert done.returncode == 0, done.stderr[-2000:]
    spec = yaml.safe_load(out.read_text())
    tasks = spec["root"]["dag"]["tasks"]
    executors = spec["deploymentSpec"]["executors"]
    segments = sorted((t for t in tasks.values() if t["taskInfo"]["name"].startswith("train to")),
                      key=lambda t: int(t["taskInfo"]["name"].rsplit(" ", 1)[1]))
    assert [t["taskInfo"]["name"] for t in segments][-1] == "train to iteration 200"
    assert len(segments) == 20
    for before, after in zip(segments, segments[1:]):
        previous = after["inputs"]["artifacts"]["previous"]["taskOutputArtifact"]["producerTask"]
        assert tasks[previous] is before
    for segment in segments:
        assert segment["retryPolicy"]["maxRetryCount"] == 2
        container = executors[segment["componentRef"]["name"].replace("comp-", "exec-")]["container"]
        assert container["image"] == "registry.example/longturn:1"
        assert container["resources"]["accelerator"]["resourceCount"] == "8"
    evals = [t for t in tasks.values() if t["taskInfo"]["name"] in ("zero_shot_eval", "final_eval")]
    assert len(evals) == 2
    params_text = tasks[next(k for k, t in tasks.items() if t["taskInfo"]["name"] == "prepare_model")]
    compiled = params_text["inputs"]["parameters"]["params_yaml"]["runtimeValue"]["constant"]
    assert compiled == (ROOT / "params-gpu.yaml").read_text()


@pytest.mark.smoke
def test_whole_pipeline_runs_locally_at_toy_size(tmp_path, tiny_model_dir):
    params = toy_params(tiny_model_dir)
    params["env"].update(tasks=["goto"])
    params["eval"].update(tasks=["goto"], episodes_per_task=2)
    params["train"].update(iterations=2, iterations_per_task=1)
    path = write_params(tmp_path / "params.yaml", params)
    done = pipeline_cli("local", "--params", path, "--root", str(tmp_path / "kfp"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    root = tmp_path / "kfp"
    reports = list(root.rglob("report/report.md"))
    assert len(reports) == 1 and "zero-shot" in reports[0].read_text().lower()
    states = sorted(root.rglob("state/checkpoints"))
    assert len(states) == 2  # one state artifact per segment
    last = max((s.parent for s in states), key=lambda d: len(list(d.glob("trajectories/*"))))
    iterations = sorted(d.name for d in (last / "trajectories").iterdir())
    assert iterations == ["iteration=0000", "iteration=0001"]
    for d in iterations:
        assert len(pd.read_parquet(last / "trajectories" / d / "part-00.parquet")) == 6
    first = min((s.parent for s in states), key=lambda d: len(list(d.glob("trajectories/*"))))
    part = "trajectories/iteration=0000/part-00.parquet"
    # resumed, not redone: the copy keeps the first segment's file as written (copy2 keeps mtime)
    assert (first / part).stat().st_mtime_ns == (last / part).stat().st_mtime_ns
    finals = [json.loads(p.read_text()) for p in root.rglob("evaluation/metrics.json")]
    assert len(finals) == 2 and all(m["overall"]["episodes"] == 2 for m in finals)


def test_submit_names_an_unreachable_host(tmp_path):
    host = f"http://127.0.0.1:{free_port()}"
    done = pipeline_cli("submit", "--params", "params.yaml", "--out", str(tmp_path / "p.yaml"),
                        "--host", host)
    assert done.returncode == 2 and f"could not submit to {host}" in done.stderr
    assert (tmp_path / "p.yaml").is_file()  # compiled before submitting


def test_bad_params_stop_before_compiling(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("train:\n  iterations: 0\n")
    done = pipeline_cli("compile", "--params", str(bad), "--out", str(tmp_path / "p.yaml"))
    assert done.returncode == 2 and "train.iterations" in done.stderr
    assert not (tmp_path / "p.yaml").exists()
