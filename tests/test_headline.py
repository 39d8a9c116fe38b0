"""What DVC shows of a run: each stage's few headline numbers (`summary.json`), not every key of
its metrics, so `dvc metrics show` as README gives it is a table a person can read."""

from __future__ import annotations

import json
import math

import pytest

from conftest import copy_repo
from longturn.run.headline import evaluation_summary, training_summary, validation_summary
from test_pipeline_smoke import _dvc

# what each stage registers in dvc.yaml, and the full metrics it is read from
SUMMARIES = {"data/validation/summary.json": "data/validation/metrics.json",
             "data/eval/zero_shot/summary.json": "data/eval/zero_shot/metrics.json",
             "data/train/summary.json": "data/train/live/metrics.json",
             "data/eval/final/summary.json": "data/eval/final/metrics.json"}


def test_dvc_metrics_show_is_each_stages_headline(tmp_path, finished_toy_repo):
    repo = copy_repo(finished_toy_repo[0], tmp_path / "repo")  # `dvc repro` of all stages

    shown = json.loads(_dvc(repo, "metrics", "show", "--json"))
    files = shown[""]["data"] if "" in shown else next(iter(shown.values()))["data"]
    assert set(files) == {*SUMMARIES, "data/critic/metrics.json"}
    full = {path: json.loads((repo / path).read_text()) for path in SUMMARIES.values()}
    for side in ("zero_shot", "final"):
        summary = files[f"data/eval/{side}/summary.json"]["data"]
        overall = full[f"data/eval/{side}/metrics.json"]["overall"]
        assert summary == {key: overall[key] for key in summary}
        assert summary["episodes"] == overall["episodes"] > 0
    train = files["data/train/summary.json"]["data"]
    assert train["iterations"] == finished_toy_repo[1]["train"]["iterations"]
    last = full["data/train/live/metrics.json"]["train"]  # DVCLive's latest step
    for key in ("valid_action_ratio", "kl_mean", "policy_loss", "value_loss"):
        assert train[key] == pytest.approx(last[key]), key
    validation = files["data/validation/summary.json"]["data"]
    assert validation["passed"] is full["data/validation/metrics.json"]["passed"]

    table = _dvc(repo, "metrics", "show")
    assert "metrics.json" not in table.replace("data/critic/metrics.json", "")
    width = max(len(line) for line in table.splitlines())
    assert width < 400, table  # every key of every metrics file was 5,391 characters


def test_summaries_read_each_stages_metrics():
    overall = {"success_rate": 0.5, "success_ci95_low": 0.1, "success_ci95_high": 0.9,
               "mean_return": 0.4, "mean_length": 3.0, "valid_action_ratio": 1.0, "episodes": 4,
               "mean_tokens": 100.0}
    assert evaluation_summary({"overall": overall, "tasks": {}}) == {
        k: v for k, v in overall.items() if k != "mean_tokens"}
    assert validation_summary(False, {"valid_action_ratio": math.nan}) == {
        "passed": False, "valid_action_ratio": None}
    history = [{"success_rate": 0.0, "kl_mean": 0.1}, {"success_rate": math.nan, "kl_mean": 0.2,
                                                       "valid_action_ratio": 0.75}]
    assert training_summary(history) == {
        "iterations": 2, "success_rate": None, "valid_action_ratio": 0.75, "kl_mean": 0.2,
        "policy_loss": None, "value_loss": None, "explained_variance": None}
    assert training_summary([])["iterations"] == 0
