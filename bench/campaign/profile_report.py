"""profile.md from a trace analysis (bench/campaign/trace.py), and the trace cut to a size that
can come back from a GPU node."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from campaign.trace import MICRO_BATCH, PHASE_PREFIX, load_events

RANGE_LABELS = {MICRO_BATCH: "update micro-batch", "engine/decode_step": "decode step"}


def _phase_table(analysis: dict[str, Any]) -> list[str]:
    total = sum(p["wall_s"] for p in analysis["phases"]) or 1.0
    peaks = analysis["peak_gpu_memory_gib"]
    lines = ["| phase | wall s | share of iteration | GPU busy s | GPU idle s | busy % | kernels "
             "| launches | host syncs | peak GPU memory GiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in analysis["phases"]:
        peak = peaks.get(p["name"])
        lines.append(f"| {p['name']} | {p['wall_s']:.2f} | {p['wall_s'] / total:.0%} | "
                     f"{p['gpu_busy_s']:.2f} | {p['wall_s'] - p['gpu_busy_s']:.2f} | "
                     f"{p['busy_share']:.0%} | {p['kernels']} | {p['launches']} | {p['syncs']} | "
                     f"{'-' if peak is None else f'{peak:.2f}'} |")
    busy = sum(p["gpu_busy_s"] for p in analysis["phases"])
    lines.append(f"| **all** | {total:.2f} | 100% | {busy:.2f} | {total - busy:.2f} | "
                 f"{busy / total:.0%} | | | | {max(peaks.values(), default=0):.2f} |")
    return lines


def _range_table(analysis: dict[str, Any]) -> list[str]:
    lines = ["| per | count | wall ms (mean) | launches (mean / max) | host syncs (mean / max) | "
             "GPU kernels (mean) | GPU ms (mean) | GPU / wall |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in analysis["ranges"].items():
        ratio = r["gpu_ms"] / r["wall_ms"] if r["wall_ms"] else 0.0
        lines.append(f"| {RANGE_LABELS.get(name, name)} | {r['count']} | {r['wall_ms']:.2f} | "
                     f"{r['launches']:.1f} / {r['max_launches']} | {r['syncs']:.1f} / "
                     f"{r['max_syncs']} | {r['kernels']:.1f} | {r['gpu_ms']:.2f} | {ratio:.0%} |")
    return lines


def _top_table(analysis: dict[str, Any]) -> list[str]:
    what = "kernel" if analysis["gpu_events"] else "CPU op (inclusive; they nest)"
    lines = [f"| # | {what} | calls | total ms | mean µs | share |", "|---|---|---|---|---|---|"]
    for i, k in enumerate(analysis["top"], 1):
        name = k["name"].replace("|", "\\|")
        name = name if len(name) <= 90 else name[:87] + "..."
        lines.append(f"| {i} | `{name}` | {k['calls']} | {k['total_ms']:.1f} | "
                     f"{k['mean_us']:.1f} | {k['share']:.1%} |")
    return lines


def render(analysis: dict[str, Any], command: str, trace_note: str) -> str:
    """The page a reader opens first to see where one iteration's time went."""
    if not analysis["phases"]:
        return "# Profile\n\nThe trace holds no phase marks: nothing to cut.\n"
    biggest = max(analysis["phases"], key=lambda p: p["wall_s"])
    head = [f"# Profile of training iteration {analysis['iteration']} ({analysis['device']})", "",
            f"Command: `{command}`", "",
            f"Largest phase: **{biggest['name']}**, {biggest['wall_s']:.2f} s with the GPU busy "
            f"{biggest['busy_share']:.0%} of it.", ""]
    if not analysis["gpu_events"]:
        head += ["No GPU activity in this trace (a CPU run): GPU columns are zero, and the "
                 "top table lists CPU ops.", ""]
    body = ["## Phases", "", *_phase_table(analysis), "",
            "GPU busy: the union of kernel, memcpy and memset time inside the phase; idle is the "
            "rest of its wall time (the host preparing work, or waiting).", "",
            "## Per micro-batch and per decode step", "", *_range_table(analysis), "",
            "Launches: kernel launches and CUDA-graph replays issued by the host inside the range; "
            "host syncs: calls that wait for the GPU; GPU kernels and ms: the work those launches "
            "queued (linked by the profiler's correlation ids).", "",
            "## The 20 costliest", "", *_top_table(analysis), "", "## Trace", "", trace_note, ""]
    return "\n".join(head + body)


def _dump_size(events: list[dict[str, Any]], path: Path) -> int:
    with gzip.open(path, "wt", compresslevel=6) as handle:
        json.dump({"traceEvents": events}, handle)
    return path.stat().st_size


def keep_trace(source: Path, dest: Path, max_bytes: int) -> str:
    """Copy the trace to `dest` within `max_bytes` (gzipped): whole if it fits; else without CPU
    ops; else only the first part of each phase. Returns a sentence saying what was kept."""
    if source.stat().st_size <= max_bytes:
        dest.write_bytes(source.read_bytes())
        return f"`{dest.name}`: the whole trace ({source.stat().st_size / 2**20:.1f} MiB gzipped)."
    events = [e for e in load_events(source) if e.get("cat") not in ("cpu_op", "python_function")]
    if _dump_size(events, dest) <= max_bytes:
        return (f"`{dest.name}`: every GPU, runtime and mark event; CPU ops left out to fit "
                f"{max_bytes / 2**20:.0f} MiB (the analysis above read the whole trace).")
    phases = [(e["ts"], e["dur"]) for e in events if e["name"].startswith(PHASE_PREFIX)]
    for fraction in (0.5, 0.25, 0.1, 0.05, 0.02):
        windows = [(start, start + fraction * dur) for start, dur in phases]
        kept = [e for e in events if any(lo <= e["ts"] < hi for lo, hi in windows)
                or e["name"].startswith(PHASE_PREFIX)]
        if _dump_size(kept, dest) <= max_bytes:
            return (f"`{dest.name}`: the first {fraction:.0%} of each phase, without CPU ops, to "
                    f"fit {max_bytes / 2**20:.0f} MiB (the analysis above read the whole trace).")
    dest.unlink()
    return "The trace did not fit the archive even cut down: it stayed on the node."
