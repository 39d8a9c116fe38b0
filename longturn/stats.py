"""Binomial summaries that stay honest with few episodes: standard error, Wilson interval, and the
exact McNemar test for two evaluations that played the same seeds."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

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


def mcnemar_exact(lost: int, gained: int) -> float:
    """Two-sided exact McNemar p-value: only discordant pairs carry information, and under 'no
    change' each is a fair coin, so p = min(1, 2·P(X ≤ min(b, c))), X ~ Binomial(b + c, 1/2).
    Summed in integers so tiny p-values are exact rather than the residue of float round-off."""
    if lost < 0 or gained < 0:
        raise ValueError(f"counts must be >= 0, got lost={lost}, gained={gained}")
    n = lost + gained
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(lost, gained) + 1))
    return min(1.0, 2 * tail / 2**n)


@dataclass(frozen=True)
class PairedOutcome:
    """Success on the same (task, seed) before and after: the 2×2 table McNemar reads."""

    task: str
    both: int = 0
    neither: int = 0
    lost: int = 0  # zero-shot succeeded, final failed
    gained: int = 0  # zero-shot failed, final succeeded
    unpaired_zero_shot: int = 0  # seeds only the zero-shot evaluation played
    unpaired_final: int = 0

    @property
    def n_pairs(self) -> int:
        return self.both + self.neither + self.lost + self.gained

    @property
    def p_value(self) -> float:
        return mcnemar_exact(self.lost, self.gained)


def _by_key(table: Any, side: str) -> dict[tuple[str, int], bool]:
    """{(task, seed): success} of a list of dicts or a pandas frame; a repeated key would make the
    pairing ambiguous, so it raises."""
    out: dict[tuple[str, int], bool] = {}
    for r in table.to_dict("records") if hasattr(table, "to_dict") else table:
        key = (str(r["task"]), int(r["episode_seed"]))
        if key in out:
            raise ValueError(f"{side} has more than one episode for task {key[0]!r}, "
                             f"seed {key[1]}")
        out[key] = bool(r["success"])
    return out


_CELLS = {(True, True): "both", (False, False): "neither", (True, False): "lost",
          (False, True): "gained"}  # (zero-shot success, final success) -> PairedOutcome field


def _count(task: str, keys: list[tuple[str, int]], zs: dict, fin: dict) -> PairedOutcome:
    cells = Counter("unpaired_zero_shot" if key not in fin
                    else "unpaired_final" if key not in zs
                    else _CELLS[zs[key], fin[key]] for key in keys)
    return PairedOutcome(task, **cells)


def paired_outcomes(zero_shot: Any, final: Any) -> dict[str, PairedOutcome]:
    """Pair two evaluations' episodes on (task, episode_seed): one entry per task (zero-shot
    order first), then `overall`. Episodes one side alone played are counted as unpaired, not
    dropped."""
    zs, fin = _by_key(zero_shot, "zero-shot"), _by_key(final, "final")
    keys = list(zs) + [k for k in fin if k not in zs]
    tasks = list(dict.fromkeys(task for task, _ in keys))
    out = {t: _count(t, [k for k in keys if k[0] == t], zs, fin) for t in tasks}
    out["overall"] = _count("overall", keys, zs, fin)
    return out
