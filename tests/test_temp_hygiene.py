"""Tests leave nothing in the system temp dir: the SGLang stand-in's logs and the rendezvous dirs
of processes killed by SIGKILL go under tmp_path (engine.sglang.log_dir, TMPDIR, the next
process's sweep), and the temp_hygiene plugin moves whatever else uses `tempfile` under the
session's basetemp. Each check runs pytest in a child whose "system" temp dir is a fresh one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
LITTER = ("sglang-*", "longturn-dist-*")


def run_pytest(args: list[str], system_tmp: Path, basetemp: Path, cwd: Path) -> str:
    """pytest in a child with TMPDIR at `system_tmp`; its output, asserting it passed."""
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TMPDIR": str(system_tmp), "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"--basetemp={basetemp}", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return done.stdout


def litter(directory: Path) -> list[str]:
    return sorted(p.name for pattern in LITTER for p in directory.rglob(pattern))


def test_sglang_and_sigkill_tests_leave_nothing_in_the_system_temp_dir(standin_env, tmp_path):
    system = tmp_path / "system_tmp"
    system.mkdir()
    selected = "dies_at_startup or launch_errors or killed or rendezvous"
    out = run_pytest(["tests/test_sglang_engine.py", "tests/test_distributed.py", "-k", selected],
                     system, tmp_path / "base", cwd=TESTS.parent)
    assert "6 passed" in out, out[-2000:]
    assert litter(system) == []


LITTERING_TEST = """
import subprocess, sys, tempfile

def test_litters():
    tempfile.mkstemp(prefix="sglang-0-", suffix=".log")
    subprocess.run([sys.executable, "-c",
                    "import tempfile; tempfile.mkdtemp(prefix='longturn-dist-')"], check=True)
"""


def test_the_plugin_moves_temp_files_of_tests_and_their_children_under_the_basetemp(tmp_path):
    suite = tmp_path / "suite"  # outside tests/: no conftest, so only the plugin acts
    suite.mkdir()
    (suite / "test_litter.py").write_text(LITTERING_TEST)
    for name in ("plain", "plugin"):
        (tmp_path / name / "system_tmp").mkdir(parents=True)
    run_pytest(["test_litter.py"], tmp_path / "plain/system_tmp", tmp_path / "plain/base", suite)
    assert len(litter(tmp_path / "plain/system_tmp")) == 2  # without it: in-process and a child's
    run_pytest(["-p", "temp_hygiene", "test_litter.py"], tmp_path / "plugin/system_tmp",
               tmp_path / "plugin/base", suite)
    assert litter(tmp_path / "plugin/system_tmp") == []
    assert len(litter(tmp_path / "plugin/base")) == 2
