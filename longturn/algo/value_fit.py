"""When the critic's explained variance means something. Torch-free: the report (a light stage
that loads no torch) reads the same floor the trainer applies."""

from __future__ import annotations

RETURN_VARIANCE_FLOOR = 1e-3
"""Below this variance of the returns (population variance over the batch's value tokens),
explained variance 1 − Var(returns − values) / Var(returns) is NaN, logged as a gap and reported
as "not meaningful": with near-constant returns (a handful of ended episodes paying the same
reward) the tiny denominator turns any critic error into numbers like −33.5 that say nothing
about the fit. 1e-3 is a spread of about 0.03 in return units, small next to the unit rewards of
the built-in envs."""


def explained_variance_meaningful(return_variance: float) -> bool:
    """True when returns vary enough for explained variance to be read (NaN counts as not)."""
    return return_variance >= RETURN_VARIANCE_FLOOR
