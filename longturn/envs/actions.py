"""Turning free-form model output into an environment action.

The text after the last `ACTION:` tag is normalised (unicode, case, whitespace, underscores, quotes,
markdown emphasis, trailing punctuation) and looked up among the env's actions, then in its synonym
table. Anything else is invalid: the env's default action runs and the caller charges a penalty.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from longturn.errors import SettingError
from longturn.reply_format import parse_reply

_EDGE_JUNK = " \t\r\n\"'`*_<>[](){}.,;:!?"
_SPACES = re.compile(r"\s+")

# An action followed by one of these words names its object ("pick up the key"): the env's actions
# take no argument, so the action alone is meant. Anything else after it ("turn left and go forward")
# stays invalid.
ARGUMENT_WORDS = frozenset({"the", "a", "an", "it", "to", "towards", "toward", "at", "on"})

# failure kinds, also used by prompt validation to count what went wrong
NO_ACTION = "no_action"
EMPTY = "empty"
UNKNOWN = "unknown_action"


@dataclass(frozen=True)
class ParsedAction:
    """The outcome of reading one model output."""

    raw_action: str  # the text after the last ACTION: tag, as written (first line, stripped)
    action: str  # the action executed: a canonical action name, or the default when invalid
    valid: bool
    failure: str | None  # None when valid, else NO_ACTION / EMPTY / UNKNOWN
    n_action_tags: int  # more than one means the model wrote several actions (the last one counts)


def normalise(text: str) -> str:
    """Canonical spelling for lookups: NFKC, lower case, `_`/`-` as spaces, no edge punctuation."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.replace("_", " ").replace("-", " ")
    text = _SPACES.sub(" ", text)
    return text.strip(_EDGE_JUNK).strip()


def extract_action_text(output: str) -> tuple[str | None, int]:
    """Text after the last ACTION: tag (first non-empty line) and how many tags there were."""
    reply = parse_reply(output)
    if reply.action_tail is None:
        return None, 0
    for line in reply.action_tail.splitlines():
        if line.strip():
            return line.strip(), reply.n_action_tags
    return "", reply.n_action_tags


class ActionTranslator:
    """An env's action vocabulary: canonical names, synonyms (data), and the default action."""

    def __init__(self, actions: list[str], synonyms: dict[str, str], default_action: str):
        if default_action not in actions:
            raise SettingError(f"default action {default_action!r} is not one of {actions}")
        bad = {k: v for k, v in synonyms.items() if v not in actions}
        if bad:
            raise SettingError(f"synonyms point to unknown actions: {bad} (actions: {actions})")
        self.actions = list(actions)
        self.default_action = default_action
        self._lookup = {normalise(k): v for k, v in synonyms.items()}
        self._lookup.update({normalise(a): a for a in actions})
        # the longest name in words: a longer head cannot match, so translate never joins one
        # (joining every head of a long reply was quadratic in its length)
        self._max_words = max(len(key.split(" ")) for key in self._lookup)

    def translate(self, text: str) -> str | None:
        """The canonical action for `text` (exact name, synonym, or either followed by its object),
        or None when nothing matches."""
        key = normalise(text)
        if key in self._lookup:
            return self._lookup[key]
        words = key.split(" ")
        for cut in range(min(len(words) - 1, self._max_words), 0, -1):  # "pick up" before "pick"
            head = " ".join(words[:cut])
            if head in self._lookup and words[cut] in ARGUMENT_WORDS:
                return self._lookup[head]
        return None

    def parse(self, output: str) -> ParsedAction:
        """Read the model's output; never raises, whatever the text."""
        default = self.default_action
        raw, n_tags = extract_action_text(output)
        if raw is None:
            return ParsedAction("", default, False, NO_ACTION if output.strip() else EMPTY, 0)
        if not normalise(raw):
            return ParsedAction(raw, default, False, EMPTY, n_tags)
        action = self.translate(raw)
        if action is None:
            return ParsedAction(raw, default, False, UNKNOWN, n_tags)
        return ParsedAction(raw, action, True, None, n_tags)
