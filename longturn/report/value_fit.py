"""The critic's explained variance as the report shows it: a number only where the returns varied
enough for it to mean something (longturn/algo/value_fit.py), "not meaningful" elsewhere.

The trainer logs no explained variance below the floor but does log `return_variance`, so a gap
with a low return variance is told apart from a metric that was never logged. Runs from before
the floor may have logged a number there; it is dropped the same way."""

from __future__ import annotations

import pandas as pd

from longturn.algo.value_fit import RETURN_VARIANCE_FLOOR, explained_variance_meaningful

KEY = "explained_variance"
NOT_MEANINGFUL = (f"not meaningful (variance of the returns below {RETURN_VARIANCE_FLOOR:g}: "
                  "near-constant returns)")


def numeric(df: pd.DataFrame, key: str) -> pd.Series:
    """Any metric column as floats, the missing steps dropped (empty when it was never logged)."""
    if key not in df.columns:
        return pd.Series(dtype=float)
    return pd.to_numeric(df[key], errors="coerce").dropna()


def not_meaningful_steps(df: pd.DataFrame) -> pd.Index:
    """Steps whose logged return variance is below the floor."""
    variance = numeric(df, "return_variance")
    return variance.index[~variance.map(explained_variance_meaningful).astype(bool)]


def explained_variance_series(df: pd.DataFrame) -> pd.Series:
    """Explained variance per step, the not-meaningful steps left out."""
    return numeric(df, KEY).drop(index=not_meaningful_steps(df), errors="ignore")


def explained_variance_reading(df: pd.DataFrame, unit: str = "iteration(s)") -> list[str]:
    """First vs last meaningful value, and how many steps were not meaningful."""
    ev, hidden = explained_variance_series(df), len(not_meaningful_steps(df))
    if not len(ev):
        return [f"- explained variance: {NOT_MEANINGFUL} in all {hidden} {unit}."] if hidden else []
    line = f"- explained variance: {ev.iloc[0]:.3f} → {ev.iloc[-1]:.3f} over {len(ev)} {unit}"
    return [line + (f"; {NOT_MEANINGFUL} in {hidden} more." if hidden else ".")]
