"""Benches use every core this process may run on unless --threads says otherwise: a bench that
silently ran one torch thread on a many-core machine would report a figure no stage sees."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
CORES = len(os.sched_getaffinity(0))
THREADED = ["cpu_engine_cuts.py", "engine_throughput.py", "gae.py", "gpu_memory.py",
            "iteration_cost.py", "ppo_update.py", "prefix_cache.py", "rollout_throughput.py",
            "trunk_reuse.py", "turn_cost.py"]
NOT_THREADED = {  # why --threads makes no sense there
    "agent_prompts.py": "renders prompts, no torch compute",
    "conversation_batches.py": "times the rollout's bookkeeping with canned replies, no model",
    "compare_estimators.py": "runs DVC experiments in child stages (torch's own default there)",
    "gpu_campaign.py": "runs the other benches and stages as child processes",
    "house_parity.py": "runs stages as child processes of two trees (torch's own default there, "
                       "the same on both sides)",
    "tiny_model.py": "builds a 3M-parameter model once",
    "parse_speed.py": "times pure-Python parsers, no torch compute",
    "cpu_threads.py": "the option itself",
}


def cpu_threads():
    spec = importlib.util.spec_from_file_location("bench_cpu_threads", BENCH / "cpu_threads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_bench_is_either_threaded_or_says_why_not():
    assert {p.name for p in BENCH.glob("*.py")} == set(THREADED) | set(NOT_THREADED)


def test_the_default_is_every_available_core_and_threads_overrides_it():
    before = torch.get_num_threads()
    try:
        assert cpu_threads().use_threads(None) == CORES
        assert cpu_threads().use_threads(1) == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("script", THREADED)
def test_threaded_benches_set_threads_through_the_shared_option(script):
    source = (BENCH / script).read_text()
    assert "add_threads_arg(" in source and "use_threads(args.threads)" in source
    assert "set_num_threads" not in source  # no bench-local default


def bench_output(*args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCH / "gae.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_bench_runs_on_every_core_by_default_and_on_threads_when_told():
    assert re.search(rf"torch threads={CORES}\b", bench_output("--tiny"))
    assert "torch threads=1\n" in bench_output("--tiny", "--threads", "1")


def test_engine_throughput_help_names_the_default():
    done = subprocess.run([sys.executable, str(BENCH / "engine_throughput.py"), "--help"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    assert f"every core this process may run on, {CORES} here" in " ".join(done.stdout.split())
