"""The reply format the agent is asked for, `THINK: <reasoning> ACTION: <action>`, in one place.

Every reader of a reply splits it here: the action parser (envs/actions.py), the KL split of THINK
and ACTION tokens (algo/ppo.py), prompt validation and the audit's turn view. The action is what
follows the LAST `ACTION:` tag (any case, spaces allowed before the colon: `ACTION : x` counts);
the THINK part is what precedes that tag, after the first `THINK:` tag when there is one.

The reply is model text, so the split is linear in its length by construction: the tag words are
found by a pattern with no quantifier (nothing to backtrack), and the spaces after a word are
read once, by a possessive run, to see whether a colon follows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

THINK_WORD = re.compile("think", re.IGNORECASE)
ACTION_WORD = re.compile("action", re.IGNORECASE)
_SPACES = re.compile(r"\s*+")  # possessive: takes the whole run and never gives any back


@dataclass(frozen=True)
class Reply:
    """A reply split into its parts (character offsets into the text)."""

    think: str  # stripped; the whole head when there is no THINK tag
    has_think: bool
    action_tail: str | None  # everything after the last ACTION tag, as written (None: no tag)
    action_start: int  # where the last ACTION tag starts (len(text) when there is none)
    n_action_tags: int


def _tag_end(text: str, word_end: int, limit: int) -> int | None:
    """Where a tag ends when the word ending at `word_end` is followed by spaces and a colon
    before `limit`, else None. Only one word ends right before a run of spaces, so each run is
    read once."""
    colon = _SPACES.match(text, word_end, limit).end()
    return colon + 1 if colon < limit and text[colon] == ":" else None


def parse_reply(text: str) -> Reply:
    """Split a reply at its last ACTION tag and its first THINK tag."""
    n_tags, start, tail = 0, len(text), None
    for word in ACTION_WORD.finditer(text):  # "action" cannot overlap itself: no tag is skipped
        end = _tag_end(text, word.end(), len(text))
        if end is not None:
            n_tags, start, tail = n_tags + 1, word.start(), end
    think_end = None
    for word in THINK_WORD.finditer(text, 0, start):
        think_end = _tag_end(text, word.end(), start)
        if think_end is not None:
            break
    head = text[think_end:start] if think_end is not None else text[:start]
    return Reply(head.strip(), think_end is not None, None if tail is None else text[tail:],
                 start, n_tags)
