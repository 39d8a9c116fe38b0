"""The train stage's log line per iteration (`describe_iteration`), one for every protocol: it
shows what the iteration measured and leaves out what it had nothing to count for. A
critic-free estimator (grpo, gigpo) trains no critic, so its metrics have no `value_loss` and
the line has no `value_loss 0.0000` that reads like a critic that learned nothing."""

from __future__ import annotations

import math

from longturn.run.metrics import describe_iteration

METRICS = {  # an iteration's metrics as the sample metrics and the update give them
    "success_rate": 0.5, "mean_reward": 0.25, "valid_action_ratio": 0.9,
    "episode_length": 2.0, "tool_calls_per_episode": 1.0, "kl_mean": 0.00123,
    "seconds_per_iteration": 12.0, "turns_per_s": 3.0}


def test_the_line_shows_the_value_loss_of_a_critic() -> None:
    line = describe_iteration(3, {**METRICS, "value_loss": 0.0421})
    assert line == ("iteration 3: success 0.500 reward 0.250 valid 0.90 replies/episode 2.00 "
                    "tool calls/episode 1.00 value_loss 0.0421 kl 0.00123 (12 s, 3.00 turns/s)")


def test_without_a_critic_the_line_has_no_value_loss() -> None:
    line = describe_iteration(3, dict(METRICS))  # no critic: no value_loss in the metrics
    assert "value_loss" not in line, line
    assert " kl 0.00123 (12 s, " in line and "  " not in line, line


def test_what_was_not_counted_is_left_out() -> None:
    """The action protocol has no tool calls (NaN); an iteration that completed no episode (the
    first fixed-turn batch of goto: 8 lock-steps, a 16-turn limit) has no length or success."""
    line = describe_iteration(0, {**METRICS, "tool_calls_per_episode": math.nan,
                                  "episode_length": math.nan, "success_rate": math.nan})
    assert "tool calls" not in line and "replies/episode" not in line, line
    assert line.startswith("iteration 0: success n/a (no episode completed) reward 0.250 valid "
                           "0.90 kl "), line
