"""A request's messages rendered into prompt ids exactly as the chat protocol renders a prompt.

The chat protocol renders a reply's window with `ChatDeltas.start` on the episode's prepared
messages (tool schemas through the template's `tools=`, or the Hermes preamble in the system
message when the template takes none). An agent sends its whole context with every call, so each
call is rendered the same way, fresh: the recorded prompt is what the model saw, and the sample
built from it is a turn whose context is exactly that call's.
"""

from __future__ import annotations

import json
from typing import Any

from longturn.rollout.chat_deltas import ChatDeltas

_KEPT = 64  # tool sets whose deltas are kept (an agent framework sends the same few each call)


class PromptRenderer:
    """Prompt ids of message lists, one `ChatDeltas` per tool set."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None):
        self.tokenizer, self.template_kwargs = tokenizer, dict(template_kwargs or {})
        self._deltas: dict[str, ChatDeltas] = {}
        self.deltas([])  # a template this protocol cannot follow fails at start, not per call

    def deltas(self, tools: list[dict[str, Any]]) -> ChatDeltas:
        key = json.dumps(tools, sort_keys=True)
        if key not in self._deltas:
            if len(self._deltas) >= _KEPT:
                self._deltas.pop(next(iter(self._deltas)))
            self._deltas[key] = ChatDeltas(self.tokenizer, tools=tools,
                                           template_kwargs=self.template_kwargs, verify=False)
        return self._deltas[key]

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
               ) -> tuple[list[dict[str, Any]], list[int]]:
        """(the messages as rendered, tool preamble in; their ids with the generation prompt)."""
        deltas = self.deltas(tools)
        prepared = deltas.prepare(messages)
        return prepared, deltas.start(prepared)

    def reply_text(self, reply_ids: list[int]) -> str:
        """A reply's text without its sampled end-of-turn token (`ChatDeltas.reply_content`)."""
        return self.deltas([]).reply_content(reply_ids)
