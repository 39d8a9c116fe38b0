"""Where two renders of a chat template differ, for the error about a template that does not
render the same text twice.

Why: a template may write a changing value (Llama 3.1's "Today Date: …" changes at midnight).
Deltas are cut after a fixed prefix and checked against a re-rendering, so such a template makes
the check fail for a reason that has nothing to do with delta tokenization; the error has to say
so and show the changing span.
"""

from __future__ import annotations

CONTEXT = 40  # characters shown either side of the first difference


def render_difference(first: str, second: str, context: int = CONTEXT) -> str:
    """`at character N: '…first…' vs '…second…'` around the first differing character; ''
    when the texts are equal."""
    if first == second:
        return ""
    at = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b),
              min(len(first), len(second)))
    low = max(0, at - context)
    return f"at character {at}: {first[low:at + context]!r} vs {second[low:at + context]!r}"


def unstable_template_message(difference: str) -> str:
    """The error text for a template whose two renders of the same messages differ."""
    return ("the chat template renders differently on each call (a non-deterministic template, "
            f"e.g. a date line): two renders of the same messages differ {difference}. The "
            "tokenization check compares against a re-rendering, so it cannot pass; set "
            "rollout.tokenization_check: off to play such a template unchecked (the deltas are "
            "cut after the earlier turns and stay what the model saw), or use a template that "
            "renders the same text each time")
