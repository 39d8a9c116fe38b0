"""Per-iteration metrics: what the rollout did, where the time went, and a DVCLive log that
survives restarts."""

from __future__ import annotations

import shutil
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from longturn.envs.termination import ABORTED, PREFIX, REASONS, count, reason_of

TERMINATION_KEYS = tuple(PREFIX + r for r in REASONS)  # the same keys on every rank
_SUMMED = ("turns", "episodes_ended", "episodes_aborted", "successes",
           *TERMINATION_KEYS)  # totals; every other metric is a ratio
ACTION_MIX_PREFIX = "action_mix/"


def _replies(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [reply for sample in samples for reply in sample["replies"] or ()]


def rollout_totals(samples: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """(numerator, denominator) of each rollout metric over the samples' replies (a turn each),
    so ranks can be summed before dividing.

    Every ended episode is counted under its termination reason (`termination/<reason>`), aborted
    ones included (also those whose reset failed: `aborted_resets` on a sample, in memory only);
    success rate and episode length are over the episodes that were not aborted."""
    replies = _replies(samples)
    ended = [r for r in replies if r["terminated"] or r["truncated"] or r["aborted"]]
    completed = [r for r in ended if not r["aborted"]]
    reasons = ([reason_of(r) for r in ended]
               + [a for s in samples for a in s.get("aborted_resets") or ()])
    counted = count(reasons)
    terminations = {key: counted[key] for key in TERMINATION_KEYS}
    aborted = sum(terminations[PREFIX + r] for r in ABORTED)
    n = float(len(replies))
    wins = float(sum(bool(r["success"]) for r in completed))
    return {
        "turns": (n, 1.0),
        "episodes_ended": (float(len(reasons)), 1.0),
        "episodes_aborted": (float(aborted), 1.0),
        **{key: (float(value), 1.0) for key, value in terminations.items()},
        "success_rate": (wins, float(len(completed))),
        "successes": (wins, 1.0),
        "episode_length": (float(sum(r["turn"] + 1 for r in completed)), float(len(completed))),
        "mean_reward": (float(sum(r["reward"] for r in replies)), n),
        "mean_env_reward": (float(sum(r["env_reward"] for r in replies)), n),
        "valid_action_ratio": (float(sum(bool(r["action_valid"]) for r in replies)), n),
        "response_tokens": (float(sum(r["end"] - r["start"] for r in replies)), n),
        "finish_length_ratio": (float(sum(r["finish_reason"] == "length" for r in replies)), n),
    }


def rollout_metrics(samples: list[dict[str, Any]],
                    sum_over_ranks: Callable[[np.ndarray], np.ndarray] | None = None
                    ) -> dict[str, float]:
    """Success among episodes that ended in this batch (aborted ones apart), reward per turn,
    lengths, validity, episodes ended per termination reason; over every rank's samples when
    ``sum_over_ranks`` (an all-reduce of an array) is given.
    A ratio with nothing to count is NaN (left out of the curves)."""
    totals = rollout_totals(samples)
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
        else:
            out[key] = float("nan")
    return out


def logprob_gap(samples: list[dict[str, Any]],
                sum_over_ranks: Callable[[np.ndarray], np.ndarray] | None = None
                ) -> dict[str, float]:
    """Mean |engine − trainer| logprob per token of a reply, both of the untempered policy, over
    the scored replies of every rank (scoring writes each reply's `logprob_gap`: a gap that
    grows says the engine samples from another policy than the one PPO corrects for). Absent
    when no reply was scored with engine logprobs."""
    gaps = [reply["logprob_gap"] for reply in _replies(samples)
            if reply.get("logprob_gap") is not None]
    total = np.array([float(sum(gaps)), float(len(gaps))])
    if sum_over_ranks is not None:
        total = sum_over_ranks(total)
    return {"logprob_gap": float(total[0] / total[1])} if total[1] > 0 else {}


def action_mix(samples: list[dict[str, Any]], actions: list[str],
               sum_over_ranks: Callable[[np.ndarray], np.ndarray] | None = None
               ) -> dict[str, float]:
    """Fraction of replies (turns) that executed each action (every rank's when `sum_over_ranks`
    is given): a policy collapsing onto one action shows here first. Keys are
    `action_mix/<action>` with spaces as underscores; actions outside `actions` (a plug-in env's
    free text) are counted under `action_mix/other`."""
    names = list(dict.fromkeys(actions)) + ["other"]
    counts = np.zeros(len(names), dtype=np.float64)
    index = {name: i for i, name in enumerate(names)}
    for reply in _replies(samples):
        counts[index.get(reply["action"], len(names) - 1)] += 1
    if sum_over_ranks is not None:
        counts = sum_over_ranks(counts)
    total = counts.sum()
    return {ACTION_MIX_PREFIX + name.replace(" ", "_"): float(c / total) if total else 0.0
            for name, c in zip(names, counts) if name != "other" or c > 0}


class PhaseClock:
    """Wall seconds per phase of one iteration (rollout, scoring, update, sync, checkpoint) and,
    on CUDA, the peak GPU memory of each phase and of the iteration. Each phase ends with a device
    synchronisation, so queued GPU work is charged to the phase that queued it, and is marked
    `phase/<name>` in a profiler trace (longturn/profiling.py)."""

    def __init__(self, device: Any = "cpu") -> None:
        import torch

        self.device = torch.device(device)
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self.peaks: dict[str, float] = {}  # GiB allocated at most during each phase (CUDA)
        self._iteration_peak = 0.0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        from longturn.profiling import PHASE, mark

        self._reset_peak()
        start = time.perf_counter()
        try:
            with mark(PHASE + name):
                yield
        finally:
            self._synchronize()
            self.seconds[name] += time.perf_counter() - start
            self._read_peak(name)

    def _reset_peak(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)

    def _read_peak(self, name: str) -> None:
        if self.device.type == "cuda":
            import torch

            peak = torch.cuda.max_memory_allocated(self.device) / 2**30
            self.peaks[name] = max(self.peaks.get(name, 0.0), peak)
            self._iteration_peak = max(self._iteration_peak, peak)

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def metrics(self, turns: float) -> dict[str, float]:
        """seconds_<phase>, seconds_per_iteration, turns_per_s (and peak_gpu_memory_gib)."""
        total = time.perf_counter() - self.started
        out = {f"seconds_{name}": value for name, value in self.seconds.items()}
        out.update(seconds_per_iteration=total, turns_per_s=turns / max(total, 1e-9))
        if self.device.type == "cuda":
            out["peak_gpu_memory_gib"] = self._iteration_peak
            out.update({f"peak_gpu_memory_gib_{name}": v for name, v in self.peaks.items()})
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
