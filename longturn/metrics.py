"""Per-iteration metrics: what the rollout did, and a DVCLive log that survives restarts."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

PREFIX = "train/"


def rollout_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Success among episodes that ended in this batch, reward per turn, lengths, validity."""
    ended = [r for r in rows if r["terminated"] or r["truncated"] or r["aborted"]]
    tokens = sum(len(r["response_ids"]) for r in rows)
    out = {
        "turns": float(len(rows)),
        "episodes_ended": float(len(ended)),
        "success_rate": float(np.mean([r["success"] for r in ended])) if ended else float("nan"),
        "episode_length": float(np.mean([r["turn"] + 1 for r in ended])) if ended else float("nan"),
        "mean_reward": float(np.mean([r["reward"] for r in rows])),
        "mean_env_reward": float(np.mean([r["env_reward"] for r in rows])),
        "valid_action_ratio": float(np.mean([r["action_valid"] for r in rows])),
        "response_tokens": tokens / max(len(rows), 1),
        "finish_length_ratio": float(np.mean([r["finish_reason"] == "length" for r in rows])),
    }
    gaps = [r["logprob_gap"] for r in rows if r.get("logprob_gap") is not None]
    if gaps:  # mean |engine − trainer| logprob per token, both of the untempered policy
        out["logprob_gap"] = float(np.mean(gaps))
    return out


class MetricsLog:
    """DVCLive metrics rebuilt from the saved history first, so a resumed run logs each step once."""

    def __init__(self, directory: Path, history: list[dict[str, float]], enabled: bool = True):
        self.live = None
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
                self.live.log_metric(PREFIX + key, float(value))
        self.live.next_step()
