"""Per-iteration metrics: what the rollout did, and a DVCLive log that survives restarts."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np

_SUMMED = ("turns", "episodes_ended")  # totals; every other metric is a ratio


def rollout_totals(rows: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """(numerator, denominator) of each rollout metric, so ranks can be summed before dividing."""
    ended = [r for r in rows if r["terminated"] or r["truncated"] or r["aborted"]]
    n = float(len(rows))
    gaps = [r["logprob_gap"] for r in rows if r.get("logprob_gap") is not None]
    return {
        "turns": (n, 1.0),
        "episodes_ended": (float(len(ended)), 1.0),
        "success_rate": (float(sum(bool(r["success"]) for r in ended)), float(len(ended))),
        "episode_length": (float(sum(r["turn"] + 1 for r in ended)), float(len(ended))),
        "mean_reward": (float(sum(r["reward"] for r in rows)), n),
        "mean_env_reward": (float(sum(r["env_reward"] for r in rows)), n),
        "valid_action_ratio": (float(sum(bool(r["action_valid"]) for r in rows)), n),
        "response_tokens": (float(sum(len(r["response_ids"]) for r in rows)), n),
        "finish_length_ratio": (float(sum(r["finish_reason"] == "length" for r in rows)), n),
        # mean |engine − trainer| logprob per token, both of the untempered policy
        "logprob_gap": (float(sum(gaps)), float(len(gaps))),
    }


def rollout_metrics(rows: list[dict[str, Any]],
                    sum_over_ranks: Callable[[np.ndarray], np.ndarray] | None = None
                    ) -> dict[str, float]:
    """Success among episodes that ended in this batch, reward per turn, lengths, validity;
    over every rank's rows when ``sum_over_ranks`` (an all-reduce of an array) is given.
    A ratio with nothing to count is NaN (left out of the curves); logprob_gap is then absent."""
    totals = rollout_totals(rows)
    keys = sorted(totals)
    values = np.array([totals[k] for k in keys], dtype=np.float64)
    if sum_over_ranks is not None:
        values = sum_over_ranks(values)
    out: dict[str, float] = {}
    for key, (numerator, denominator) in zip(keys, values):
        if key in _SUMMED:
            out[key] = float(numerator)
        elif denominator > 0:
            out[key] = float(numerator / denominator)
        elif key != "logprob_gap":
            out[key] = float("nan")
    return out


class MetricsLog:
    """DVCLive metrics rebuilt from the saved history first, so a resumed run logs each step once.
    Keys are logged as `namespace/key`, the label `dvc plots show` puts on each curve."""

    def __init__(self, directory: Path, history: list[dict[str, float]], enabled: bool = True,
                 namespace: str = "train"):
        self.live = None
        self.prefix = namespace + "/"
        if not enabled:
            return
        from dvclive import Live

        shutil.rmtree(directory, ignore_errors=True)
        self.live = Live(dir=str(directory), save_dvc_exp=False, dvcyaml=False)
        for metrics in history:
            self.log(metrics)

    def log(self, metrics: dict[str, float]) -> None:
        if self.live is None:
            return
        for key, value in sorted(metrics.items()):
            if value == value:  # NaN (no episode ended this iteration) is left out of the curve
                self.live.log_metric(self.prefix + key, float(value))
        self.live.next_step()
