"""Wilson interval and standard error edge cases."""

import pytest

from longturn.stats import standard_error, wilson_interval


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
