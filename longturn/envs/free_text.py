"""Action parsing for envs whose actions are free text (a gymnasium `Text` space).

There is no vocabulary to translate into: the text after the last `ACTION:` runs as written (edge
whitespace, quotes and markdown emphasis removed). Text outside the space (a character it does not
allow, too long) is invalid like an unknown action: the default action runs and the rollout charges
the penalty.
"""

from __future__ import annotations

from typing import Any

from longturn.envs.actions import EMPTY, NO_ACTION, UNKNOWN, ParsedAction, extract_action_text

_WRAPPERS = " \t\r\n\"'`*"


class FreeTextTranslator:
    """Same `parse` as ActionTranslator; `space` (a gymnasium Text space, or None) says what is
    allowed."""

    def __init__(self, default_action: str, space: Any = None):
        self.actions: list[str] = []
        self.default_action = default_action
        self.space = space

    def parse(self, output: str) -> ParsedAction:
        default = self.default_action
        raw, n_tags = extract_action_text(output)
        if raw is None:
            return ParsedAction("", default, False, NO_ACTION if output.strip() else EMPTY, 0)
        text = raw.strip(_WRAPPERS)
        if not text:
            return ParsedAction(raw, default, False, EMPTY, n_tags)
        if self.space is not None and not self.space.contains(text):
            return ParsedAction(raw, default, False, UNKNOWN, n_tags)
        return ParsedAction(raw, text, True, None, n_tags)
