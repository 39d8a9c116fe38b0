"""The node in one line: GPU, driver, torch and CUDA, bf16, free memory (or the CPU in tiny mode).

Read before anything else runs, so a result is never read without knowing what produced it."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from typing import Any

import torch

from longturn.device import fast_bf16


def _driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    proc = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=30)
    return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout else None


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def describe() -> dict[str, Any]:
    """The figures of the environment line, as data."""
    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cpu": _cpu_name(), "cpu_cores": os.cpu_count(),
                           "cuda": torch.version.cuda, "gpu": None}
    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        free, total = torch.cuda.mem_get_info(device)
        out.update(gpu=torch.cuda.get_device_name(device), gpu_count=torch.cuda.device_count(),
                   driver=_driver(), bf16=fast_bf16(device), free_gib=free / 2**30,
                   total_gib=total / 2**30,
                   capability=".".join(map(str, torch.cuda.get_device_capability(device))))
    else:
        out.update(bf16=fast_bf16(torch.device("cpu")))
    return out


def one_line(env: dict[str, Any]) -> str:
    if env["gpu"]:
        return (f"{env['gpu_count']}× {env['gpu']} (sm {env['capability']}), driver "
                f"{env['driver']}, torch {env['torch']} CUDA {env['cuda']}, bf16 "
                f"{'yes' if env['bf16'] else 'no'}, {env['free_gib']:.1f} of "
                f"{env['total_gib']:.1f} GiB free; {env['cpu_cores']} CPU cores; Python "
                f"{env['python']}")
    return (f"no GPU: {env['cpu']} ({env['cpu_cores']} cores), torch {env['torch']}, bf16 "
            f"{'native' if env['bf16'] else 'emulated'}; Python {env['python']}")
