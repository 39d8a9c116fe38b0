"""GPU utilisation and memory sampled every second by `nvidia-smi -l 1` beside the learning run,
and the mean of the samples inside each stage's window."""

from __future__ import annotations

import csv
import shutil
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

QUERY = "timestamp,utilization.gpu,memory.used"


class GPUSampler:
    """`nvidia-smi` writing one CSV row a second to `path` until stopped; absent on a machine
    without nvidia-smi (`available` is then False and nothing is written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.available = shutil.which("nvidia-smi") is not None
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        if not self.available:
            return
        handle = self.path.open("a")
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}",
                                      "--format=csv,noheader,nounits", "-l", "1"],
                                     stdout=handle, stderr=subprocess.DEVNULL)
        handle.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None


def read_samples(path: Path) -> list[tuple[float, float, float]]:
    """(epoch seconds, utilisation %, memory MiB) per row; rows nvidia-smi cut short are
    skipped. Several GPUs give several rows per second: each counts."""
    if not path.is_file():
        return []
    out = []
    for row in csv.reader(path.read_text().splitlines()):
        try:
            stamp = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((stamp, float(row[1]), float(row[2])))
        except (IndexError, ValueError):
            continue
    return out


def window_means(samples: list[tuple[float, float, float]], start: float,
                 end: float) -> dict[str, Any] | None:
    """Mean utilisation, peak memory and sample count inside [start, end]; None without
    samples there."""
    inside = [s for s in samples if start <= s[0] <= end]
    if not inside:
        return None
    return {"utilization_mean": sum(s[1] for s in inside) / len(inside),
            "memory_peak_mib": max(s[2] for s in inside), "samples": len(inside)}
