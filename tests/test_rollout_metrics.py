"""Rollout metrics: ratios over ended episodes / turns, and summed over ranks before dividing. They
read the samples a batch trains on (a turn's sample holds its one reply), so each test builds
turn rows, as the env slots write them, and converts them as the train loop does."""

from __future__ import annotations

import math

import numpy as np

from longturn.rollout.samples import samples_from_turns
from longturn.run import metrics as batch
from longturn.run.metrics import logprob_gap


def rollout_metrics(rows, sum_over_ranks=None):
    return batch.rollout_metrics(samples_from_turns(rows), sum_over_ranks)


def rollout_totals(rows):
    return batch.rollout_totals(samples_from_turns(rows))


def _row(turn: int, success: bool = False, ended: bool = False, valid: bool = True,
         reward: float = 0.0) -> dict:
    return {"turn": turn, "success": success, "terminated": ended and success,
            "truncated": ended and not success, "aborted": False, "action_valid": valid,
            "reward": reward, "env_reward": max(reward, 0.0), "response_ids": [1] * 4,
            "finish_reason": "stop"}


def test_one_rank() -> None:
    rows = [_row(0), _row(5, success=True, ended=True, reward=0.9),
            _row(31, ended=True, valid=False, reward=-0.1)]
    m = rollout_metrics(rows)
    assert m["turns"] == 3 and m["episodes_ended"] == 2
    assert m["success_rate"] == 0.5 and m["episode_length"] == (6 + 32) / 2
    assert m["valid_action_ratio"] == 2 / 3 and math.isclose(m["mean_reward"], 0.8 / 3)


def test_nothing_ended_is_nan() -> None:
    m = rollout_metrics([_row(0), _row(1)])
    assert math.isnan(m["success_rate"]) and math.isnan(m["episode_length"])


def _sample(*gaps: float | None) -> dict:
    return {"replies": [{"logprob_gap": gap} for gap in gaps]}


def test_logprob_gap_is_read_from_the_scored_replies_of_any_sample() -> None:
    """A turn's sample has one reply, a packed episode several: each reply counts once."""
    samples = [_sample(0.1), _sample(0.3, None, 0.5)]
    assert math.isclose(logprob_gap(samples)["logprob_gap"], 0.3)
    assert logprob_gap([_sample(None)]) == {}  # nothing scored with engine logprobs


def test_logprob_gap_sums_ranks_before_dividing() -> None:
    other_rank = np.array([0.9, 3.0])  # three replies of 0.3 on rank 1
    m = logprob_gap([_sample(0.1)], lambda total: total + other_rank)
    assert math.isclose(m["logprob_gap"], 1.0 / 4)


def test_ranks_are_summed_before_dividing() -> None:
    """Rank 0 ended 1 episode (a success), rank 1 ended 3 (failures): 1/4, not mean(1, 0)."""
    rank0 = [_row(2, success=True, ended=True)]
    rank1 = [_row(9, ended=True), _row(9, ended=True), _row(9, ended=True)]
    totals = rollout_totals(rank1)  # what rank 1 adds in the all-reduce
    contribution = np.array([totals[k] for k in sorted(totals)])
    m = rollout_metrics(rank0, lambda values: values + contribution)
    assert m["turns"] == 4 and m["episodes_ended"] == 4
    assert m["success_rate"] == 0.25
    assert m["episode_length"] == (3 + 10 * 3) / 4


def test_action_mix_fractions_other_and_ranks() -> None:
    from longturn.run.metrics import action_mix

    rows = samples_from_turns([{"action": a, "response_ids": [1]}
                               for a in ("go forward", "go forward", "turn left", "dance")])
    mix = action_mix(rows, ["turn left", "turn right", "go forward"])
    assert mix == {"action_mix/turn_left": 0.25, "action_mix/turn_right": 0.0,
                   "action_mix/go_forward": 0.5, "action_mix/other": 0.25}
    doubled = action_mix(rows[:2], ["turn left", "go forward"], lambda a: a + np.array([1, 0, 0]))
    assert doubled == {"action_mix/turn_left": 1 / 3, "action_mix/go_forward": 2 / 3}


def test_termination_reasons_counted_and_aborted_apart() -> None:
    """An aborted episode ends (counted by reason) but is neither a success nor a failure; an
    episode whose reset failed rides on a row as `aborted_resets`, and on its sample."""
    rows = [_row(3, success=True, ended=True), _row(7, ended=True),
            {**_row(2), "aborted": True, "termination": "timeout", "reward": 0.0},
            {**_row(4), "terminated": True, "success": False},
            {**_row(0), "aborted_resets": ["env_error", "env_error"]}]
    m = rollout_metrics(rows)
    assert {k: m[f"termination/{k}"] for k in ("success", "failure", "time_limit", "env_error",
                                               "timeout")} == \
        {"success": 1, "failure": 1, "time_limit": 1, "env_error": 2, "timeout": 1}
    assert m["episodes_ended"] == 6 and m["episodes_aborted"] == 3
    assert m["success_rate"] == 1 / 3  # over the three episodes the env did not abort
    assert m["episode_length"] == (4 + 8 + 5) / 3


def test_termination_counts_are_summed_over_ranks() -> None:
    rank1 = [{**_row(1), "aborted": True, "termination": "env_error"}]
    totals = rollout_totals(rank1)
    contribution = np.array([totals[k] for k in sorted(totals)])
    m = rollout_metrics([_row(5, success=True, ended=True)], lambda v: v + contribution)
    assert m["termination/env_error"] == 1 and m["termination/success"] == 1
    assert m["episodes_aborted"] == 1 and m["success_rate"] == 1.0
    assert sorted(rollout_totals([])) == sorted(totals)  # the same keys on every rank
