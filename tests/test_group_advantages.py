"""GRPO and GiGPO turn advantages against numbers worked out by hand (γ_step = 0.5).

Group A, three episodes from one seed, plus one whose env failed:
  a1: s0 → s1 → s2, rewards 0, 0, 1 (success on turn 2)      R = 1    G = .25, .5, 1
  a2: s0 → s3,      rewards −0.1, 1 (one invalid action)     R = 0.9  G = .4, 1
  a3: s0,           reward 0 (one turn, truncated)           R = 0    G = 0
  c1: s0 → (aborted)                                          no return: 0, in no group
Group B: b1 alone, also from s0 (a different seed's group: never compared with group A).
Mean R of A = 0.63333; R − mean = .36667, .26667, −.63333; population std .449691.
"""

from __future__ import annotations

import numpy as np
import pytest

from longturn.algo.group_advantages import (GroupParams, discounted_returns, normalised,
                                            turn_advantages)

# (group, episode, turn, reward, observation, aborted)
ROWS = [
    ("A", "a1", 0, 0.0, "s0", False), ("A", "a1", 1, 0.0, "s1", False),
    ("A", "a1", 2, 1.0, "s2", False),
    ("A", "a2", 0, -0.1, "s0", False), ("A", "a2", 1, 1.0, "s3", False),
    ("A", "a3", 0, 0.0, "s0", False),
    ("A", "c1", 0, 5.0, "s0", False), ("A", "c1", 1, 0.0, "s1", True),
    ("B", "b1", 0, 1.0, "s0", False),
]


def _run(estimator: str, norm_std: bool, rows=ROWS, step_weight: float = 1.0):
    columns = list(zip(*rows))
    params = GroupParams(estimator=estimator, gamma_step=0.5, norm_std=norm_std,
                         step_weight=step_weight)
    return turn_advantages(*columns, params=params)


def test_grpo_turn_advantages_by_hand() -> None:
    adv, ret = _run("grpo", norm_std=False)
    expected = [.36667 * .25, .36667 * .5, .36667, .26667 * .5, .26667, -.63333, 0, 0, 0]
    np.testing.assert_allclose(adv, expected, atol=1e-4)
    np.testing.assert_allclose(ret, [.25, .5, 1, .4, 1, 0, 0, 0, 1.0], atol=1e-9)


def test_grpo_divides_by_the_group_std() -> None:
    adv, _ = _run("grpo", norm_std=True)
    scale = 1 / (0.449691 + 1e-6)
    expected = np.array([.36667 * .25, .36667 * .5, .36667, .26667 * .5, .26667, -.63333]) * scale
    np.testing.assert_allclose(adv[:6], expected, atol=1e-3)
    assert not adv[6:].any()  # the aborted episode and the group of one


def test_gigpo_adds_the_anchor_state_advantage() -> None:
    grpo, _ = _run("grpo", norm_std=False)
    adv, _ = _run("gigpo", norm_std=False, step_weight=2.0)
    # s0 in group A: G = .25 (a1), .4 (a2), 0 (a3); mean .216667 → .033333, .183333, −.216667
    step = np.zeros(len(ROWS))
    step[[0, 3, 5]] = [.033333, .183333, -.216667]
    np.testing.assert_allclose(adv, grpo + 2.0 * step, atol=1e-5)
    np.testing.assert_allclose(adv[[0, 3, 5]], [.158333, .5, -1.066667], atol=1e-5)


def test_repeated_state_in_one_episode_is_an_anchor_group() -> None:
    rows = [("A", "x", 0, 0.0, "s", False), ("A", "x", 1, 0.0, "s", False),
            ("A", "x", 2, 1.0, "t", False)]
    adv, ret = _run("gigpo", norm_std=False, rows=rows)
    np.testing.assert_allclose(ret, [.25, .5, 1])
    np.testing.assert_allclose(adv, [-.125, .125, 0])  # one episode: no episode-level signal


def test_row_order_does_not_matter() -> None:
    order = np.random.default_rng(0).permutation(len(ROWS))
    adv, ret = _run("gigpo", norm_std=True, rows=[ROWS[i] for i in order])
    base_adv, base_ret = _run("gigpo", norm_std=True)
    np.testing.assert_allclose(adv, base_adv[order])
    np.testing.assert_allclose(ret, base_ret[order])


def test_helpers_and_errors() -> None:
    np.testing.assert_allclose(discounted_returns(np.array([1.0, 0.0, 2.0]), 0.5), [1.5, 1.0, 2.0])
    assert not normalised(np.array([3.0]), True).any()
    np.testing.assert_allclose(normalised(np.array([1.0, 1.0]), True), [0, 0])
    with pytest.raises(ValueError, match="critic-free"):
        GroupParams(estimator="gae", gamma_step=1.0, norm_std=True, step_weight=1.0)
    bad = [("A", "e", 0, 0.0, "s", False), ("B", "e", 1, 0.0, "s", False)]
    with pytest.raises(ValueError, match="several groups"):
        _run("grpo", False, rows=bad)
