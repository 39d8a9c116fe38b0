"""The train stage's log line per iteration (`Protocol.describe`): it shows the value loss only
when the update trained a critic. A critic-free estimator (grpo, gigpo) trains none, so its
metrics have no `value_loss` and the line has no `value_loss 0.0000` that reads like a critic
that learned nothing."""

from __future__ import annotations

import pytest

from longturn.run.protocol import PROTOCOLS

METRICS = {  # what both protocols' lines read, as an iteration's metrics give it
    "success_rate": 0.5, "mean_reward": 0.25, "valid_action_ratio": 0.9,
    "mean_assistant_turns": 2.0, "tool_calls_per_episode": 1.0, "kl_mean": 0.00123,
    "seconds_per_iteration": 12.0, "turns_per_s": 3.0}


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_the_line_shows_the_value_loss_of_a_critic(name: str) -> None:
    line = PROTOCOLS[name].describe(3, {**METRICS, "value_loss": 0.0421})
    assert line.startswith("iteration 3: success 0.500 reward 0.250 "), line
    assert "value_loss 0.0421 kl 0.00123 (12 s, " in line, line


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_without_a_critic_the_line_has_no_value_loss(name: str) -> None:
    line = PROTOCOLS[name].describe(3, dict(METRICS))  # no critic: no value_loss in the metrics
    assert "value_loss" not in line, line
    assert " kl 0.00123 (12 s, " in line and "  " not in line, line
