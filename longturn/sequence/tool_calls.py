"""Tool calls in a reply, in the Hermes format ChatML models use:
`<tool_call>{"name": …, "arguments": {…}}</tool_call>`, any number per reply.

The model's text is only parsed as JSON (`json.loads`), never evaluated. A call that cannot be
used (bad JSON, no name, arguments that are not an object, a tag left open) comes back as a
`BadToolCall` whose message becomes the tool result, so the episode goes on and the model sees
what it got wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BadToolCall:
    raw: str
    error: str


def _one_call(raw: str) -> ToolCall | BadToolCall:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        return BadToolCall(raw, f"the tool call is not valid JSON ({err.msg} at character "
                                f"{err.pos})")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return BadToolCall(raw, 'a tool call is a JSON object with a "name" string and an '
                                '"arguments" object')
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return BadToolCall(raw, f'the "arguments" of tool {data["name"]!r} must be a JSON object')
    return ToolCall(data["name"], arguments)


def parse_tool_calls(text: str) -> list[ToolCall | BadToolCall]:
    """Every `<tool_call>` block of a reply, in order; an opening tag without its closing tag is
    a BadToolCall too."""
    calls: list[ToolCall | BadToolCall] = [_one_call(m.group(1).strip())
                                           for m in _CALL.finditer(text)]
    rest = _CALL.sub("", text)
    if OPEN in rest:
        calls.append(BadToolCall(rest[rest.index(OPEN):], f"{OPEN} was never closed by {CLOSE}"))
    return calls
