"""The conversation an episode stores (`messages`, on its last sample) as messages to show, each
of the episode's replies attached to the assistant message that holds its text.

Replies are matched from the end: the conversation ends with the episode's last reply, and the
prompt's few-shot examples are assistant messages too. A packed or windowed conversation holds
every reply of its episode; an agent's is the conversation its last call sent, which may leave out
what earlier calls replied (an agent may drop or summarise history), so its earliest replies can
be left with no message, and an episode still running has stored no conversation yet."""

from __future__ import annotations

import json
from typing import Any


def _call_text(call: dict[str, Any]) -> str:
    """An OpenAI-style tool call as `→ name(arguments)`."""
    function = call.get("function") or {}
    return f"→ {function.get('name')}({function.get('arguments') or ''})"


def message_text(message: dict[str, Any]) -> str:
    """What a message says: its content (JSON where it is not a string), then the tool calls
    an OpenAI client keeps beside it (an agent's reply that calls a tool)."""
    content = message.get("content")
    text = content if isinstance(content, str) else "" if content is None else json.dumps(content)
    calls = [_call_text(c) for c in message.get("tool_calls") or []]
    return "\n".join([t for t in (text, *calls) if t])


def conversation_messages(text: str | None, turns: list[int]) -> list[dict[str, Any]]:
    """The stored conversation, each message with its `reply`: the turn of the episode's reply
    it holds (the last assistant messages, matched from the end), or None."""
    messages = [{"index": i, "role": m.get("role"), "name": m.get("name"),
                 "content": message_text(m), "reply": None}
                for i, m in enumerate(json.loads(text or "[]"))]
    assistant = [m for m in messages if m["role"] == "assistant"]
    n = min(len(assistant), len(turns))
    for message, turn in zip(assistant[len(assistant) - n:], turns[len(turns) - n:]):
        message["reply"] = turn
    return messages
