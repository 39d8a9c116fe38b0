"""How each turn ended its episode, with the project's one definition of the reasons
(longturn.envs.termination); a turn that did not end its episode `continues`."""

from __future__ import annotations

import pandas as pd

from longturn.envs.termination import REASONS, reason_of

CONTINUES = "continues"
ORDER = (*REASONS, CONTINUES)
FLAG_COLUMNS = ("terminated", "truncated", "aborted", "success")


def turn_reasons(frame: pd.DataFrame) -> pd.Series:
    """The reason of every row of a turn frame holding FLAG_COLUMNS (and maybe `termination`)."""
    columns = [c for c in (*FLAG_COLUMNS, "termination") if c in frame.columns]
    records = frame[columns].astype(object).where(frame[columns].notna(), None)
    reasons = [reason_of(r) or CONTINUES for r in records.to_dict(orient="records")]
    return pd.Series(reasons, index=frame.index, dtype=object)


def reason_counts(reasons: pd.Series) -> dict[str, int]:
    """Every reason of ORDER (zeros included) → how many turns, then any other stored reason."""
    counts = reasons.value_counts().to_dict()
    out = {r: int(counts.pop(r, 0)) for r in ORDER}
    out.update({str(k): int(v) for k, v in counts.items()})
    return out
