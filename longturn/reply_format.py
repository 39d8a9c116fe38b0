"""The reply format the agent is asked for, `THINK: <reasoning> ACTION: <action>`, in one place.

Every reader of a reply splits it here: the action parser (envs/actions.py), the KL split of THINK
and ACTION tokens (algo/ppo.py), prompt validation and the audit's turn view. The action is what
follows the LAST `ACTION:` tag (any case, spaces allowed before the colon: `ACTION : x` counts);
the THINK part is what precedes that tag, after the first `THINK:` tag when there is one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

THINK_TAG = re.compile(r"think\s*:", re.IGNORECASE)
ACTION_TAG = re.compile(r"action\s*:", re.IGNORECASE)


@dataclass(frozen=True)
class Reply:
    """A reply split into its parts (character offsets into the text)."""

    think: str  # stripped; the whole head when there is no THINK tag
    has_think: bool
    action_tail: str | None  # everything after the last ACTION tag, as written (None: no tag)
    action_start: int  # where the last ACTION tag starts (len(text) when there is none)
    n_action_tags: int


def parse_reply(text: str) -> Reply:
    """Split a reply at its last ACTION tag and its first THINK tag."""
    tags = list(ACTION_TAG.finditer(text))
    start = tags[-1].start() if tags else len(text)
    tail = text[tags[-1].end():] if tags else None
    think = THINK_TAG.search(text, 0, start)
    head = text[think.end():start] if think else text[:start]
    return Reply(head.strip(), think is not None, tail, start, len(tags))
