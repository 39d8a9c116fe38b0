"""`dvc exp run -S key=value` as the README documents it: on the toy pipeline, it reruns only the
stages that read the key, and the experiment's params and metrics show the change."""

from __future__ import annotations

import json

import pandas as pd
import yaml

from longturn.trajectories import read_metadata
from conftest import copy_repo
from test_pipeline_smoke import _dvc, dvc_run


def test_exp_run_set_param_reruns_only_its_readers(tmp_path, finished_toy_repo):
    repo = copy_repo(finished_toy_repo[0], tmp_path / "repo")  # a committed run of all stages
    tasks = finished_toy_repo[1]["eval"]["tasks"]
    targets = ("validate_prompts", "zero_shot_eval")  # the cheap part of the DAG

    out = _dvc(repo, "exp", "run", "-n", "fewer", "-S", "eval.episodes_per_task=1", *targets)

    assert "Running stage 'zero_shot_eval'" in out
    for stage in ("prepare_model", "validate_prompts"):  # they do not read eval.episodes_per_task
        assert f"Running stage '{stage}'" not in out
    assert yaml.safe_load((repo / "params.yaml").read_text())["eval"]["episodes_per_task"] == 1
    metrics = json.loads((repo / "data/eval/zero_shot/metrics.json").read_text())
    assert metrics["overall"]["episodes"] == len(tasks)  # one per task
    shown = dvc_run(repo, "exp", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    experiment = find_experiment(json.loads(shown.stdout), "fewer")
    data = experiment["data"]
    assert data["params"]["params.yaml"]["data"]["eval"]["episodes_per_task"] == 1
    assert data["metrics"]["data/eval/zero_shot/summary.json"]["data"]["episodes"] == len(tasks)


def find_experiment(shown: list[dict], name: str) -> dict:
    """The experiment called `name` in `dvc exp show --json` output (DVC 3 layout)."""
    for commit in shown:
        for exp in commit.get("experiments") or []:
            if exp.get("name") == name:
                return exp["revs"][0]
    raise AssertionError(f"no experiment {name!r} in dvc exp show: {json.dumps(shown)[:2000]}")


def test_exp_run_switches_the_estimator_and_writes_no_critic(tmp_path, finished_toy_repo):
    from longturn.algo.sample_scoring import audit_samples_file

    repo = copy_repo(finished_toy_repo[0], tmp_path / "repo")  # a committed GAE run

    out = _dvc(repo, "exp", "run", "-n", "gigpo", "-S", "algo.advantage=gigpo",
               "-S", "algo.group_size=2")

    for stage in ("critic_warmup", "train", "final_eval", "report"):
        assert f"Running stage '{stage}'" in out
    for stage in ("prepare_model", "validate_prompts", "zero_shot_eval"):
        assert f"Running stage '{stage}'" not in out
    assert [p.name for p in (repo / "data/critic/warm").iterdir()] == ["NO_CRITIC.md"]
    parts = sorted(repo.glob("data/train/trajectories/iteration=*/part-00.parquet"))
    assert parts and all(audit_samples_file(part) < 1e-5 for part in parts)
    for part in parts:  # critic-free: no values, the estimator the metadata names
        assert pd.read_parquet(part, columns=["values"])["values"].isna().all()
        assert json.loads(read_metadata(part)["algo"])["advantage"] == "gigpo"
    assert "No critic: the estimator compares episodes" in (repo / "data/report/report.md").read_text()
