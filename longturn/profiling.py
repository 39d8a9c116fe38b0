"""One training iteration under torch.profiler, and the marks its trace is read by.

Why: on a borrowed GPU the question is where an iteration's time goes (rollout, scoring, update,
weight push) and whether the GPU is busy or waiting on the host. The phases, every update
micro-batch and every decode step are marked with `mark(...)` ranges, so a trace of one
iteration can be cut into them afterwards (bench/campaign/trace.py). A mark costs a few
microseconds when no profiler runs.
"""

from __future__ import annotations

import gzip
import json
import shutil
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterator

import torch

PHASE = "phase/"              # phase/rollout, phase/scoring, phase/update, phase/sync
MICRO_BATCH = "update/micro_batch"
DECODE_STEP = "engine/decode_step"
TRACE_FILE = "trace.json.gz"
PHASES_FILE = "phases.json"


def mark(name: str) -> Any:
    """A named range in a profiler trace (a no-op context when nothing records)."""
    return torch.profiler.record_function(name)


class IterationProfiler:
    """Profiles the iteration numbered `iteration` if this process runs it: writes the gzipped
    Chrome trace (`trace.json.gz`, opens in Perfetto or chrome://tracing) and `phases.json`
    (wall seconds and peak GPU memory per phase, from the iteration's PhaseClock) to `out`."""

    def __init__(self, iteration: int, out: str | Path) -> None:
        self.iteration = iteration
        self.out = Path(out)

    def around(self, iteration: int) -> Any:
        return self._profiled() if iteration == self.iteration else nullcontext()

    @contextmanager
    def _profiled(self) -> Iterator[None]:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.out.mkdir(parents=True, exist_ok=True)
        with profile(activities=activities, record_shapes=False, with_stack=False,
                     profile_memory=False) as prof:
            yield
        raw = self.out / "trace.json"
        prof.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(self.out / TRACE_FILE, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()

    def record_phases(self, iteration: int, clock: Any) -> None:
        """The profiled iteration's PhaseClock figures, beside its trace."""
        if iteration != self.iteration:
            return
        data = {"iteration": iteration, "seconds": dict(clock.seconds),
                "peak_gpu_memory_gib": dict(clock.peaks), "device": str(clock.device)}
        (self.out / PHASES_FILE).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
