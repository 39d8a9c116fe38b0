"""Wilson interval, standard error, and the exact paired McNemar test with its pairing."""

from fractions import Fraction
from math import comb

import pandas as pd
import pytest

from longturn.stats import mcnemar_exact, paired_outcomes, standard_error, wilson_interval


@pytest.mark.parametrize("n", range(1, 60))
def test_interval_contains_estimate_and_hits_exact_ends(n):
    assert wilson_interval(0, n)[0] == 0.0
    assert wilson_interval(n, n)[1] == 1.0
    for k in range(n + 1):
        low, high = wilson_interval(k, n)
        assert 0.0 <= low <= k / n <= high <= 1.0


def test_known_values():
    low, high = wilson_interval(2, 8)
    assert low == pytest.approx(0.0715, abs=1e-4) and high == pytest.approx(0.5907, abs=1e-4)
    assert standard_error(2, 8) == pytest.approx((0.25 * 0.75 / 8) ** 0.5)
    assert wilson_interval(0, 0) == (0.0, 1.0) and standard_error(0, 0) == 0.0


def binomial_two_sided(b: int, c: int) -> Fraction:
    """The textbook definition, term by term: 2 · P(X ≤ min(b, c)), X ~ Bin(b + c, 1/2), capped."""
    n = b + c
    tail = sum(Fraction(comb(n, k), 2**n) for k in range(min(b, c) + 1))
    return min(Fraction(1), 2 * tail)


def test_mcnemar_hand_computed_values():
    # b=8, c=17: 2 · (1 + 25 + 300 + 2300 + 12650 + 53130 + 177100 + 480700 + 1081575) / 2^25
    assert binomial_two_sided(8, 17) == Fraction(2 * 1807781, 2**25)
    assert mcnemar_exact(8, 17) == pytest.approx(float(binomial_two_sided(8, 17)), rel=1e-12)
    assert mcnemar_exact(8, 17) == pytest.approx(0.10775, abs=1e-5)
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 6) == 0.03125  # 2 · (1/2)^6, exactly
    assert mcnemar_exact(5, 5) == 1.0  # 2 · P(X ≤ 5) > 1 is capped
    assert mcnemar_exact(0, 1) == 1.0


@pytest.mark.parametrize("b", range(0, 13))
def test_mcnemar_matches_definition_and_is_symmetric(b):
    for c in range(0, 13):
        p = mcnemar_exact(b, c)
        assert p == mcnemar_exact(c, b)
        assert 0.0 < p <= 1.0
        assert p == pytest.approx(float(binomial_two_sided(b, c)), rel=1e-12)


def test_mcnemar_tiny_p_is_not_zero_and_negative_counts_raise():
    assert mcnemar_exact(0, 200) == pytest.approx(2.0**-199, rel=1e-12)
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 3)


def episodes(task: str, outcomes: dict[int, bool]) -> list[dict]:
    return [{"task": task, "episode_seed": s, "success": ok, "length": 5}
            for s, ok in outcomes.items()]


def test_paired_outcomes_counts_cells_and_unpaired_episodes():
    zero_shot = (episodes("goto", {0: True, 1: True, 2: False, 3: False, 4: False, 9: True})
                 + episodes("open", {0: False}))
    final = (episodes("goto", {0: True, 1: False, 2: True, 3: True, 4: False, 7: False})
             + episodes("pickup", {0: True}))
    out = paired_outcomes(zero_shot, final)
    assert list(out) == ["goto", "open", "pickup", "overall"]
    goto = out["goto"]
    assert (goto.both, goto.neither, goto.lost, goto.gained) == (1, 1, 1, 2)
    assert (goto.unpaired_zero_shot, goto.unpaired_final, goto.n_pairs) == (1, 1, 5)
    assert goto.p_value == mcnemar_exact(1, 2) == 1.0
    assert out["open"].n_pairs == 0 and out["open"].unpaired_zero_shot == 1
    assert out["pickup"].unpaired_final == 1 and out["pickup"].p_value == 1.0
    overall = out["overall"]
    assert (overall.n_pairs, overall.lost, overall.gained) == (5, 1, 2)
    assert (overall.unpaired_zero_shot, overall.unpaired_final) == (2, 2)


def test_paired_outcomes_pairs_on_task_and_seed_not_on_row_order():
    """Same seed under two tasks are two pairs; shuffled DataFrames pair the same way."""
    zs = pd.DataFrame(episodes("a", {1: True, 2: False}) + episodes("b", {1: False}))
    fin = pd.DataFrame(episodes("b", {1: True}) + episodes("a", {2: True, 1: True}))
    out = paired_outcomes(zs.iloc[::-1], fin)
    assert (out["a"].both, out["a"].gained, out["a"].lost) == (1, 1, 0)
    assert (out["b"].gained, out["b"].n_pairs) == (1, 1)
    assert (out["overall"].gained, out["overall"].n_pairs) == (2, 3)


def test_paired_outcomes_rejects_a_seed_played_twice():
    twice = episodes("goto", {0: True}) + episodes("goto", {0: False})
    with pytest.raises(ValueError, match="more than one episode"):
        paired_outcomes(twice, episodes("goto", {0: True}))
