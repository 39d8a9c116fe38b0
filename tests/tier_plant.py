"""Planted tests for test_tiers.py (copied into a temp dir; SLEEP is substituted there).

Kept out of test_tiers.py so the rule does not mark test_tiers itself slow."""

import subprocess, sys, time
import pytest

SCRIPT = "components/train.py"


def _start_stage():
    return [sys.executable, SCRIPT]

@pytest.fixture
def trained():
    from longturn.run.training import run_training
    return lambda: run_training()

def test_stage_through_a_helper():
    _start_stage()

def test_trains_through_a_fixture(trained):
    pass

def test_resolves_against_an_index():
    args = ["pip", "install", "--dry-run"]

def test_plain():
    assert True

def test_sleeps_past_the_limit():
    time.sleep(SLEEP)
