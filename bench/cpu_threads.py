"""Torch intra-op threads of a bench: every core this process may run on unless --threads says
otherwise. A bench that silently ran on one thread of a many-core machine would report a figure
no user sees (stages run with torch's own default, which is the cores they are given)."""

from __future__ import annotations

import argparse
import os


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity: a container or taskset may allow fewer
    than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform (macOS)
        return os.cpu_count() or 1


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"--threads must be >= 1, got {value}")
    return value


def add_threads_arg(parser: argparse.ArgumentParser) -> None:
    """--threads N, the same in every bench."""
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch intra-op threads on a CPU (default: every core this process "
                             f"may run on, {available_cores()} here)")


def use_threads(threads: int | None) -> int:
    """Set torch's intra-op threads to `threads`, or to every available core when None; returns
    the count in effect."""
    import torch

    torch.set_num_threads(threads or available_cores())
    return torch.get_num_threads()
