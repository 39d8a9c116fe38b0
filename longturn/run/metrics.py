"""Per-iteration metrics beside what the samples say (rollout/sample_metrics.py): the engine's
logprob gap, where the time went, the iteration's log line, and a DVCLive log that survives
restarts."""

from __future__ import annotations

import shutil
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np


def logprob_gap(samples: list[dict[str, Any]],
                sum_over_ranks: Callable[[np.ndarray], np.ndarray] | None = None
                ) -> dict[str, float]:
    """Mean |engine − trainer| logprob per token of a reply, both of the untempered policy, over
    the scored replies of every rank (scoring writes each reply's `logprob_gap`: a gap that
    grows says the engine samples from another policy than the one PPO corrects for). Absent
    when no reply was scored with engine logprobs."""
    gaps = [reply["logprob_gap"] for sample in samples for reply in sample["replies"] or ()
            if reply.get("logprob_gap") is not None]
    total = np.array([float(sum(gaps)), float(len(gaps))])
    if sum_over_ranks is not None:
        total = sum_over_ranks(total)
    return {"logprob_gap": float(total[0] / total[1])} if total[1] > 0 else {}


def _shown(m: dict[str, float], key: str) -> bool:
    return key in m and m[key] == m[key]  # logged, and not NaN (nothing to count)


def describe_iteration(iteration: int, m: dict[str, float]) -> str:
    """An iteration's metrics (rollout/sample_metrics.py and the update's) as one log line. What
    was not measured is left out: the valid-action ratio when no reply is parsed into an action,
    tool calls when no sample holds a conversation, the value loss when no critic trained (a
    made-up 0 would read as a critic that learned nothing)."""
    success = (f"{m['success_rate']:.3f}" if _shown(m, "success_rate")
               else "n/a (no episode completed)")  # a fixed-turn batch may end none
    parts = [f"iteration {iteration}: success {success} "
             f"reward {m.get('mean_reward', float('nan')):.3f}"]
    for key, label, fmt in (("valid_action_ratio", "valid", "{:.2f}"),
                            ("episode_length", "replies/episode", "{:.2f}"),
                            ("tool_calls_per_episode", "tool calls/episode", "{:.2f}"),
                            ("value_loss", "value_loss", "{:.4f}"),
                            ("kl_mean", "kl", "{:.5f}")):
        if _shown(m, key):
            parts.append(f"{label} {fmt.format(m[key])}")
    return (" ".join(parts) + f" ({m['seconds_per_iteration']:.0f} s, "
            f"{m['turns_per_s']:.2f} turns/s)")


class PhaseClock:
    """Wall seconds per phase of one iteration (rollout, scoring, update, sync, checkpoint) and,
    on CUDA, the peak GPU memory of each phase and of the iteration. Each phase ends with a device
    synchronisation, so queued GPU work is charged to the phase that queued it, and is marked
    `phase/<name>` in a profiler trace (longturn/profiling.py)."""

    def __init__(self, device: Any = "cpu") -> None:
        import torch

        self.device = torch.device(device)
        self.cuda = torch.cuda if self.device.type == "cuda" else None
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self.peaks: dict[str, float] = {}  # GiB allocated at most during each phase (CUDA)
        self._iteration_peak = 0.0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        from longturn.profiling import PHASE, mark

        if self.cuda:
            self.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        try:
            with mark(PHASE + name):
                yield
        finally:
            if self.cuda:
                self.cuda.synchronize(self.device)
            self.seconds[name] += time.perf_counter() - start
            if self.cuda:
                peak = self.cuda.max_memory_allocated(self.device) / 2**30
                self.peaks[name] = max(self.peaks.get(name, 0.0), peak)
                self._iteration_peak = max(self._iteration_peak, peak)

    def metrics(self, turns: float) -> dict[str, float]:
        """seconds_<phase>, seconds_per_iteration, turns_per_s (and peak_gpu_memory_gib)."""
        total = time.perf_counter() - self.started
        out = {f"seconds_{name}": value for name, value in self.seconds.items()}
        out.update(seconds_per_iteration=total, turns_per_s=turns / max(total, 1e-9))
        if self.cuda:
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
