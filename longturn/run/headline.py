"""The few numbers of each stage that DVC shows (`dvc metrics show`, `dvc exp show`).

A stage's full metrics stay in its `metrics.json`; DVC tables every key of every registered file
as a column, which made `dvc metrics show` on one toy run 5,391 characters wide. So each stage also
writes `summary.json`, the file dvc.yaml registers as its metrics. A key means the same in every
stage that writes it, so stages share columns: `success_rate` is the share of completed episodes
that succeeded, `valid_action_ratio` of replies with a valid action (chat: no failed tool call).
"""

from __future__ import annotations

from typing import Any

from longturn.rollout.sample_metrics import json_safe

SUMMARY_FILE = "summary.json"

_EVALUATION_KEYS = ("success_rate", "success_ci95_low", "success_ci95_high", "mean_return",
                    "mean_length", "valid_action_ratio", "episodes")
_TRAINING_KEYS = ("success_rate", "valid_action_ratio", "kl_mean", "policy_loss", "value_loss",
                  "explained_variance")


def evaluation_summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """An evaluation's overall success (with its Wilson 95 % interval), return, length, valid
    replies and episodes, from its metrics.json layout (`evaluation.metrics_by_task`)."""
    overall = metrics["overall"]
    return json_safe({key: overall.get(key) for key in _EVALUATION_KEYS})


def validation_summary(passed: bool, totals: dict[str, float]) -> dict[str, Any]:
    """Whether the gate passed, and the valid replies over every task (`totals`: the sample
    metrics of all the stage's samples)."""
    return json_safe({"passed": passed, "valid_action_ratio": totals["valid_action_ratio"]})


def training_summary(history: list[dict[str, float]]) -> dict[str, Any]:
    """The iterations done and the last one's success, valid replies, KL and losses (a key the
    run does not log, such as `value_loss` without a critic, is None; NaN, nothing to count, is None
    too, which DVC shows as `-`)."""
    last = history[-1] if history else {}
    return json_safe({"iterations": len(history), **{key: last.get(key) for key in _TRAINING_KEYS}})
