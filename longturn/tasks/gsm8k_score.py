"""GSM8K's rule-based score as verl computes it (`verl.utils.reward_score.gsm8k`): the same
functions, arguments and results, written here, so verl's GSM8K tool and interaction score the
same way after their import line names this project (`from longturn.tasks.verl_api import
gsm8k`).

The answer is read from the end of the reply only (its last 300 characters: a long reasoning
trace costs the regex nothing), and compared with the ground truth as text, as verl does: the
ground truth is the string after `####` in the GSM8K solution, commas removed.

- `strict`: the number after the last `#### ` (commas and `$` removed); no `#### ` → no answer,
  so the format is part of the reward.
- `flexible`: the last run of digits, `.`, `,` and a leading `-` anywhere in the text that is not
  just `.` (taken as it is: a `1,000` stays `1,000`).
"""

from __future__ import annotations

import re

CLIP_CHARS = 300  # only the reply's tail is searched, where the final answer is
_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_NUMBERISH = re.compile(r"(-?[0-9.,]+)")
_NOT_AN_ANSWER = ("", ".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer text `method` reads from the reply, or None when it finds none."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = _NUMBERISH.findall(tail)
    if not found:
        return None
    # the last candidate that is more than a dot; verl keeps the first one when all are dots
    return next((c for c in reversed(found) if c not in _NOT_AN_ANSWER), found[0])


def compute_score(solution_str: str, ground_truth: str, method: str = "strict",
                  format_score: float = 0.0, score: float = 1.0) -> float:
    """`score` when the extracted answer equals `ground_truth` (as text), `format_score` when an
    answer was found but differs, 0 when none was found."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0
    return score if answer == ground_truth else format_score
