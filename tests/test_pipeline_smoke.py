"""Toy-size end-to-end runs of the pipeline stages (tiny model).

One test calls the first three stage scripts in-process and audits what they wrote; another runs
the real `dvc repro` of all seven stages in a scratch repo, audits the trajectories, and checks
that an eval-only param change reruns only the evaluations and the report.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from components import prepare_model, validate_prompts, zero_shot_eval
from longturn.algo.sample_scoring import audit_samples_file
from longturn.algo.scoring import GAE_METADATA_KEYS
from longturn.run.evaluation import summarise
from longturn.trajectories import SAMPLE_SCHEMA, read_metadata
from conftest import copy_repo, torch_extensions_env
from reply_rows import reply_rows

ROOT = Path(__file__).resolve().parents[1]


def toy_params(model_dir: str) -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"] = {"source": model_dir, "dtype": "float32"}
    params["env"].update(tasks=["goto", "open"], max_turns=3)
    params["engine"].update(batch_size=4)
    params["engine"]["sampling"].update(max_new_tokens=6)
    params["eval"].update(tasks=["goto", "open"], episodes_per_task=3, parallel_envs=2)
    params["validation"].update(samples_per_task=2, min_valid_action_ratio=0.0)
    params["rollout"].update(n_envs=2, turns_per_env=3)
    params["ppo"].update(mini_batch_size=6, micro_batch_size=3, bf16=False)
    params["warmup"].update(iterations=2)
    params["train"].update(iterations=2)
    return params


def write_params(path: Path, params: dict) -> str:
    path.write_text(yaml.safe_dump(params))
    return str(path)


def test_three_stages_write_consistent_results(tmp_path, tiny_model_dir):
    p = write_params(tmp_path / "params.yaml", toy_params(tiny_model_dir))
    base, val, ev = tmp_path / "base", tmp_path / "validation", tmp_path / "eval"
    assert prepare_model.main(["--params", p, "--out", str(base)]) == 0
    assert (base / "config.json").is_file() and (base / "chat_template.jinja").is_file()
    assert validate_prompts.main(["--params", p, "--model-dir", str(base), "--out", str(val)]) == 0
    report = (val / "report.md").read_text()
    assert "Prompt validation: passed" in report and "## open" in report
    assert len(pd.read_parquet(val / "samples.parquet")) == 4
    assert zero_shot_eval.main(["--params", p, "--model-dir", str(base), "--out", str(ev)]) == 0

    samples = pq.read_table(ev / "turns.parquet")
    assert set(SAMPLE_SCHEMA.names) <= set(samples.schema.names)
    assert read_metadata(ev / "turns.parquet")["schema_version"] == "2"
    samples = samples.to_pandas()
    # a window turn is a sample with one reply spanning its response; evaluation trains nothing
    assert (samples["replies"].map(len) == 1).all()
    assert samples["advantages"].isna().all() and samples["values"].isna().all()
    turns = reply_rows(samples)
    assert (turns["start"] == 0).all()
    assert (turns["end"] == turns["response_ids"].map(len)).all()
    episodes = pd.read_parquet(ev / "episodes.parquet")
    metrics = json.loads((ev / "metrics.json").read_text())
    assert len(episodes) == 6 and episodes["episode_id"].is_unique
    assert (episodes["length"] <= 3).all()
    # every episode's turns are numbered 0..n-1 and their count is its length
    for eid, group in turns.groupby("episode_id"):
        assert sorted(group["turn"]) == list(range(len(group)))
        assert episodes.set_index("episode_id").loc[eid, "length"] == len(group)
    # turn-level bookkeeping: invalid actions run the default and pay the penalty
    invalid = turns[~turns["action_valid"]]
    assert (invalid["action"] == "go forward").all()
    assert ((invalid["env_reward"] - invalid["reward"]).round(5) == 0.1).all()
    # metrics recomputed from episodes.parquet
    for task in ("goto", "open"):
        rows = episodes[episodes["task"] == task].to_dict("records")
        recomputed = summarise(rows)  # what the episode rows alone say; the rest: their samples
        assert {k: metrics["tasks"][task][k] for k in recomputed} == pytest.approx(recomputed)
        assert metrics["tasks"][task]["tool_calls_per_episode"] is None  # no conversation
    assert metrics["overall"]["episodes"] == 6


def test_bad_model_source_is_one_clear_line(tmp_path, tiny_model_dir):
    params = toy_params(tiny_model_dir)
    params["model"]["source"] = str(tmp_path / "missing")
    p = write_params(tmp_path / "params.yaml", params)
    proc = subprocess.run([sys.executable, "components/prepare_model.py", "--params", p,
                           "--out", str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "model.source" in proc.stderr and "Traceback" not in proc.stderr


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def dvc_run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """dvc in `cwd` with only this venv on PATH; a failure is returned, not asserted."""
    bin_dir = Path(sys.executable).parent
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(cwd), "PYTHONPATH": str(cwd),
           **torch_extensions_env()}
    return subprocess.run([str(bin_dir / "dvc"), *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600)


def _dvc(cwd: Path, *args: str) -> str:
    proc = dvc_run(cwd, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def scratch_repo(tmp_path: Path, params: dict) -> Path:
    """A committed git + DVC repo with this checkout's code, configs, examples, dvc.yaml,
    .dvcignore and `params`."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("longturn", "components", "configs", "examples"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "dvc.yaml", repo / "dvc.yaml")
    write_params(repo / "params.yaml", params)
    _git(repo, "init", "-q")
    _dvc(repo, "init", "-q")
    shutil.copy(ROOT / ".dvcignore", repo / ".dvcignore")  # what DVC leaves out of dir deps
    _dvc(repo, "config", "core.analytics", "false")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "scratch")
    return repo


STAGES = ("prepare_model", "validate_prompts", "zero_shot_eval", "critic_warmup", "train",
          "final_eval", "report")


def test_dvc_repro_and_single_stage_rerun(tmp_path, finished_toy_repo):
    finished, params, out = finished_toy_repo  # `dvc repro` of all seven stages
    repo = copy_repo(finished, tmp_path / "repo")
    for stage in STAGES:
        assert f"Running stage '{stage}'" in out
    parts = sorted(repo.glob("data/train/trajectories/iteration=*/part-00.parquet"))
    assert len(parts) == 2
    for part in parts:  # the file records the discounts params.yaml set, and keeps their rule
        meta = read_metadata(part)
        assert {k: float(meta[k]) for k in GAE_METADATA_KEYS} == pytest.approx(
            {k: float(params["gae"][k]) for k in GAE_METADATA_KEYS})
        assert audit_samples_file(part) < 1e-4
    report = (repo / "data/report/report.md").read_text()
    assert "goto" in report and (repo / "data/report/tasks.png").is_file()
    # each curve is labelled by the stage that logged it
    assert (repo / "data/critic/live/plots/metrics/warmup/value_loss.tsv").is_file()
    assert (repo / "data/train/live/plots/metrics/train/value_loss.tsv").is_file()

    params["eval"]["episodes_per_task"] = 2
    write_params(repo / "params.yaml", params)
    out = _dvc(repo, "repro")
    for stage in ("zero_shot_eval", "final_eval", "report"):
        assert f"Running stage '{stage}'" in out
    for stage in ("prepare_model", "validate_prompts", "critic_warmup", "train"):
        assert f"Running stage '{stage}'" not in out
    assert len(pd.read_parquet(repo / "data/eval/zero_shot/episodes.parquet")) == 4

    out = _dvc(repo, "repro", "-f", "-s", "zero_shot_eval")
    assert "Running stage 'zero_shot_eval'" in out and "Running stage 'prepare_model'" not in out
