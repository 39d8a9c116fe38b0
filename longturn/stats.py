"""Binomial summaries that stay honest with few episodes: standard error and Wilson interval."""

from __future__ import annotations

import math

Z95 = 1.959963984540054


def standard_error(successes: int, n: int) -> float:
    """sqrt(p(1-p)/n); 0 for n = 0."""
    if n == 0:
        return 0.0
    p = successes / n
    return math.sqrt(p * (1 - p) / n)


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval; unlike p ± z·SE it never leaves [0, 1] and is not empty at p = 0 or 1."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends, no float residue
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high
