"""Where one training iteration's time goes, read from its torch.profiler trace.

The train loop marks each phase (`phase/rollout`, `phase/scoring`, `phase/update`, `phase/sync`),
each update micro-batch and each decode step (longturn/profiling.py). This module cuts the Chrome
trace along those marks: per phase, wall time against the time the GPU was busy (the union of
kernel, memcpy and memset intervals), kernel launches and host synchronisations; per micro-batch
and per decode step, the launches, syncs and kernels whose host-side call falls inside it (the
profiler's `correlation` id ties a kernel to the launch that queued it, CUDA-graph replays
included); and the 20 kernels that cost the most GPU time. A CPU-only trace (the campaign's tiny
mode) has no GPU events: the same tables are written with zeros and the costliest CPU ops.
"""

from __future__ import annotations

import bisect
import gzip
import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATEGORIES = {"cuda_runtime", "cuda_driver"}
PHASE_PREFIX = "phase/"
MICRO_BATCH = "update/micro_batch"
DECODE_STEP = "engine/decode_step"


def is_launch(name: str) -> bool:
    """A host call that queues GPU work: a kernel launch or a CUDA-graph replay."""
    return "LaunchKernel" in name or "GraphLaunch" in name or "LaunchCooperativeKernel" in name


def is_sync(name: str) -> bool:
    """A host call that waits for the GPU (`.item()`, `.tolist()`, `.cpu()` end in one)."""
    return name.endswith("Synchronize") or name in ("cudaMemcpy", "cuMemcpy", "cuMemcpyDtoH_v2")


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The complete-duration ('X') events of a Chrome trace, gzipped or not."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        data = json.load(handle)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def union_seconds(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of [start, end) intervals (µs) clipped to [lo, hi), in seconds."""
    total, reach = 0.0, lo
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total / 1e6


@dataclass
class PhaseFigures:
    name: str
    wall_s: float
    gpu_busy_s: float
    kernels: int
    launches: int
    syncs: int

    @property
    def busy_share(self) -> float:
        return self.gpu_busy_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class RangeFigures:
    """Means over every range of one mark (e.g. all update micro-batches of the iteration)."""

    name: str
    count: int
    wall_ms: float
    launches: float
    syncs: float
    kernels: float
    gpu_ms: float
    max_launches: int
    max_syncs: int


class Trace:
    """One iteration's events, indexed for cutting along the marks."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
        self.host = sorted((e for e in events if e.get("cat") in HOST_CATEGORIES),
                           key=lambda e: e["ts"])
        self.host_ts = [e["ts"] for e in self.host]
        self.marks = [e for e in events if e.get("cat") == "user_annotation"]
        self.gpu_by_correlation: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for e in self.gpu:
            self.gpu_by_correlation[e.get("args", {}).get("correlation")].append(e)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu)

    def ranges(self, name: str) -> list[tuple[float, float]]:
        return sorted((e["ts"], e["ts"] + e["dur"]) for e in self.marks if e["name"] == name)

    def host_calls(self, lo: float, hi: float) -> list[dict[str, Any]]:
        return self.host[bisect.bisect_left(self.host_ts, lo):bisect.bisect_left(self.host_ts, hi)]

    def phases(self) -> list[PhaseFigures]:
        names = list(dict.fromkeys(e["name"] for e in sorted(self.marks, key=lambda e: e["ts"])
                                   if e["name"].startswith(PHASE_PREFIX)))
        out = []
        for name in names:
            wall = busy = 0.0
            kernels = launches = syncs = 0
            for lo, hi in self.ranges(name):
                wall += (hi - lo) / 1e6
                inside = [(e["ts"], e["ts"] + e["dur"]) for e in self.gpu
                          if e["ts"] < hi and e["ts"] + e["dur"] > lo]
                busy += union_seconds(inside, lo, hi)
                kernels += sum(1 for e in self.gpu if lo <= e["ts"] < hi
                               and e.get("cat") == "kernel")
                calls = self.host_calls(lo, hi)
                launches += sum(is_launch(c["name"]) for c in calls)
                syncs += sum(is_sync(c["name"]) for c in calls)
            out.append(PhaseFigures(name[len(PHASE_PREFIX):], wall, busy, kernels, launches,
                                    syncs))
        return out

    def per_range(self, name: str) -> RangeFigures | None:
        spans = self.ranges(name)
        if not spans:
            return None
        launches, syncs, kernels, gpu_ms = [], [], [], []
        for lo, hi in spans:
            calls = self.host_calls(lo, hi)
            launched = [c for c in calls if is_launch(c["name"])]
            queued = [k for c in launched for k in
                      self.gpu_by_correlation.get(c.get("args", {}).get("correlation"), [])]
            launches.append(len(launched))
            syncs.append(sum(is_sync(c["name"]) for c in calls))
            kernels.append(len(queued))
            gpu_ms.append(sum(k["dur"] for k in queued) / 1e3)
        n = len(spans)
        return RangeFigures(name, n, sum(hi - lo for lo, hi in spans) / n / 1e3,
                            sum(launches) / n, sum(syncs) / n, sum(kernels) / n,
                            sum(gpu_ms) / n, max(launches), max(syncs))

    def top(self, n: int = 20) -> list[dict[str, Any]]:
        """The n costliest kernels by total GPU time; on a CPU-only trace, the costliest CPU ops
        by inclusive time (they nest, so their shares may add up past 100 %)."""
        pool = self.gpu if self.has_gpu else [e for e in self.events if e.get("cat") == "cpu_op"]
        total = sum(e["dur"] for e in pool) or 1.0
        grouped: dict[str, list[float]] = defaultdict(list)
        for e in pool:
            grouped[e["name"]].append(e["dur"])
        ranked = sorted(grouped.items(), key=lambda kv: -sum(kv[1]))[:n]
        return [{"name": name, "calls": len(d), "total_ms": sum(d) / 1e3,
                 "mean_us": sum(d) / len(d), "share": sum(d) / total} for name, d in ranked]


def analyse(trace_path: str | Path, phases_path: str | Path | None = None) -> dict[str, Any]:
    """Everything profile.md shows, as plain data (also stored in results.json)."""
    trace = Trace(load_events(trace_path))
    phases_file = json.loads(Path(phases_path).read_text()) if phases_path else {}
    ranges = {name: trace.per_range(name) for name in (MICRO_BATCH, DECODE_STEP)}
    return {
        "gpu_events": trace.has_gpu,
        "iteration": phases_file.get("iteration"),
        "device": phases_file.get("device"),
        "phases": [dict(asdict(p), busy_share=p.busy_share) for p in trace.phases()],
        "ranges": {k: asdict(v) for k, v in ranges.items() if v is not None},
        "top": trace.top(20),
        "peak_gpu_memory_gib": phases_file.get("peak_gpu_memory_gib", {}),
    }
