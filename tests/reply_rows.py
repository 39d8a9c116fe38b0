"""Sample files (schema v2) read as one row per reply, for tests that check what was acted and
rewarded turn by turn.

Why a helper of the tests' own: a window-N turn is a sample with one reply and a packed episode a
sample with many, so a check written against turns needs the replies flattened; doing it here in
plain pandas keeps those checks independent of the audit's reader (longturn/audit/replies.py),
which some of them test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import pandas as pd


def reply_rows(samples: pd.DataFrame) -> pd.DataFrame:
    """One row per reply (`replies_of`), with `sample` / `reply`: the sample's row number and the
    reply's index in it."""
    return pd.DataFrame([{**row, "sample": i, "reply": k}
                         for i, sample in enumerate(samples.to_dict("records"))
                         for k, row in enumerate(replies_of([sample]))])


def read_reply_rows(paths: Path | Iterable[Path]) -> pd.DataFrame:
    """The replies of one or more sample files, files in the order given."""
    paths = [paths] if isinstance(paths, Path) else list(paths)
    return reply_rows(pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True))


def replies_of(samples: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a collector returned (samples in memory) as one dict per reply: its sample's columns
    (all but `replies`) and the reply's fields, in order."""
    return [{**{k: v for k, v in sample.items() if k != "replies"}, **reply}
            for sample in samples
            for reply in (sample["replies"] if sample["replies"] is not None else ())]
