"""What a subcommand returns: the text a person reads and the data `--json` prints."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd


@dataclass
class Output:
    """Text for the terminal, data for `--json`, and the exit status (1: the check found a
    difference or an error above tolerance)."""

    text: str
    data: Any
    status: int = 0

    def render(self, as_json: bool) -> str:
        return json.dumps(plain(self.data), indent=2, sort_keys=False) if as_json else self.text


def plain(value: Any) -> Any:
    """JSON-ready copy: frames as lists of records, numpy scalars and arrays as Python, NaN as null."""
    if isinstance(value, pd.DataFrame):
        return [plain(r) for r in value.to_dict(orient="records")]
    if isinstance(value, pd.Series):
        return plain(value.to_dict())
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return plain(value.item())
    if (isinstance(value, float) and not math.isfinite(value)) or value is pd.NA or value is pd.NaT:
        return None
    return value


def table(frame: pd.DataFrame) -> str:
    """A frame as aligned plain text, every row and column, floats to 4 decimals."""
    if frame.empty:
        return "(no rows)"
    with pd.option_context("display.max_rows", None, "display.max_columns", None,
                           "display.width", 250, "display.max_colwidth", 80,
                           "display.float_format", "{:.4f}".format):
        return frame.to_string(index=False)
