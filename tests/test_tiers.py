"""The tier rule (tests/tiers.py): which tests become `slow` or `network`, and the fast tier's
time limit failing a run by name. Each case runs a planted test file in a child pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def run_planted(tmp_path: Path, *args: str, sleep: float = 0.0) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ("tiers",)\n')
    # read here, not as a module constant: the rule follows module strings into the test
    planted = (TESTS / "tier_plant.py").read_text()
    (tmp_path / "test_planted.py").write_text(planted.replace("SLEEP", repr(sleep)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "--rootdir", str(tmp_path), str(tmp_path), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_slow_and_network_follow_helpers_and_fixtures(tmp_path):
    slow = run_planted(tmp_path, "--collect-only", "-m", "slow")
    assert "test_stage_through_a_helper" in slow.stdout
    assert "test_trains_through_a_fixture" in slow.stdout
    assert "test_plain" not in slow.stdout
    network = run_planted(tmp_path, "--collect-only", "-m", "network")
    assert "test_resolves_against_an_index" in network.stdout
    assert "test_plain" not in network.stdout


def test_a_fast_tier_test_over_the_limit_fails_the_run_by_name(tmp_path):
    proc = run_planted(tmp_path, "-m", "not slow and not network", "--max-fast-call-s", "0.5",
                       sleep=1.5)
    assert proc.returncode == 1, proc.stdout
    assert "FAILED test_planted.py::test_sleeps_past_the_limit: call took" in proc.stdout
    assert "test_plain:" not in proc.stdout


def test_without_the_option_a_long_test_passes(tmp_path):
    proc = run_planted(tmp_path, "-m", "not slow and not network", sleep=1.0)
    assert proc.returncode == 0, proc.stdout


HEAVY = ["test_training.py", "test_train_stage.py", "test_sglang_stages.py", "test_faults.py",
         "test_env_workers.py", "test_vision.py", "test_kubeflow_pipeline.py", "test_dvc_exp.py"]


def test_the_suites_known_heavy_modules_are_slow_by_rule():
    """The modules that made the old suite slow each have tests the rule marks `slow`."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "--collect-only", "-m", "slow", *(f"tests/{m}" for m in HEAVY)],
                          cwd=TESTS.parent, capture_output=True, text=True, timeout=600)
    for module in HEAVY:
        assert f"tests/{module}::" in proc.stdout, f"{module}: no test marked slow"
