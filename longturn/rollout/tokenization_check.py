"""The sanity check of delta tokenization: the ids an episode accumulated against a full
re-rendering of its message list by the chat template.

Outcomes, from best to worst:
- `identical`: the same ids.
- `same_text`: the same text in other tokens (the model sampled a split of a word that the
  tokenizer would not produce). Training uses the sampled ids, which is right; never an error.
- `strippable`: the texts differ only by whitespace or by reasoning spans the template strips from
  earlier turns (Qwen3-style templates drop `<think>…</think>` from all but the last reply, so the
  re-rendering lacks reasoning the model saw and was trained on).
- `mismatch`: anything else, e.g. a tool result rendered differently than it was appended.

Modes (`rollout.tokenization_check`): `strict` fails on anything worse than `same_text`,
`ignore_strippable` fails only on `mismatch`, `off` skips the check (nothing is re-rendered). A
failure names the first differing span as text, with its context, from both sides; when the
template itself renders differently on each call (a date line), the failure says that instead of
blaming the deltas (`ChatDeltas.check_stable`).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from longturn.errors import UserError
from longturn.rollout.chat_deltas import ChatDeltas

MODES = ("strict", "ignore_strippable", "off")
STRIPPABLE_SPANS = (("<think>", "</think>"),)
_CONTEXT = 30


class TokenizationMismatch(UserError):
    """Delta tokenization and the full re-rendering disagree beyond what the mode allows."""


@dataclass(frozen=True)
class CheckResult:
    outcome: str  # identical | same_text | strippable | mismatch | skipped
    span: str = ""  # the first differing span, as text from both sides


def first_difference(ours: str, theirs: str) -> str:
    """The first span where two texts differ, with context: `…ctx[ours: X | template: Y]ctx…`."""
    matcher = difflib.SequenceMatcher(None, ours, theirs, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            before = ours[max(0, i1 - _CONTEXT):i1]
            after = ours[i2:i2 + _CONTEXT]
            return (f"…{before!r}[deltas: {ours[i1:i2]!r} | template: {theirs[j1:j2]!r}]"
                    f"{after!r}…")
    return ""


def _normalised(text: str) -> str:
    for start, end in STRIPPABLE_SPANS:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), "", text, flags=re.DOTALL)
    return "".join(text.split())


def compare(deltas: ChatDeltas, messages: list[dict[str, Any]], ids: list[int],
            add_generation_prompt: bool = False) -> CheckResult:
    """Classify how the accumulated `ids` differ from the template's rendering of `messages`."""
    full_text = deltas.render(messages, add_generation_prompt)
    if deltas.encode(full_text, cached=False) == list(ids):
        return CheckResult("identical")
    ours = deltas.decode(list(ids))
    if ours == full_text:
        return CheckResult("same_text")
    span = first_difference(ours, full_text)
    if _normalised(ours) == _normalised(full_text):
        return CheckResult("strippable", span)
    return CheckResult("mismatch", span)


def check_tokenization(deltas: ChatDeltas, messages: list[dict[str, Any]], ids: list[int],
                       mode: str, add_generation_prompt: bool = False,
                       where: str = "an episode") -> CheckResult:
    """`compare`, then fail as `mode` says; returns the result when it passes."""
    if mode not in MODES:
        raise UserError(f"rollout.tokenization_check is {mode!r}; use one of {', '.join(MODES)}")
    if mode == "off":
        return CheckResult("skipped")
    result = compare(deltas, messages, ids, add_generation_prompt)
    if result.outcome == "mismatch" or (mode == "strict" and result.outcome == "strippable"):
        deltas.check_stable()
        hint = ("only whitespace or stripped reasoning differs: rollout.tokenization_check "
                "ignore_strippable allows that" if result.outcome == "strippable" else
                "the template renders the conversation differently than it was appended")
        raise TokenizationMismatch(
            f"delta tokenization of {where} differs from the chat template's full rendering "
            f"({mode}): {result.span}; {hint}")
    return result
