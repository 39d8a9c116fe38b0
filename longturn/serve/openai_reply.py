"""A sampled reply as an OpenAI assistant message: text, or `tool_calls` read from its Hermes
`<tool_call>` blocks (`tasks.tool_calls`, the parser the chat protocol uses).

A reply becomes `tool_calls` only when every block in it parses: a reply with a broken call is
returned as the text the model wrote, so the agent sees what the model did instead of a silently
shortened list. The text before the first block is the message's content.
"""

from __future__ import annotations

import json
from typing import Any

from longturn.tasks.tool_calls import OPEN, ToolCall, parse_tool_calls


def reply_message(content: str, finish_reason: str, read_tool_calls: bool,
                  request_index: int) -> tuple[dict[str, Any], str]:
    """(the assistant message, its OpenAI finish_reason) for a reply's text and the engine's
    finish reason (stop or length)."""
    calls = parse_tool_calls(content) if read_tool_calls else []
    if not calls or not all(isinstance(c, ToolCall) for c in calls):
        return {"role": "assistant", "content": content}, finish_reason
    before = content[:content.find(OPEN)].strip()
    # ids unique in the episode, so a later request's assistant message can be matched to the
    # reply that made it
    tool_calls = [{"id": f"call_{request_index}_{k}", "type": "function",
                   "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                  for k, c in enumerate(calls)]
    return {"role": "assistant", "content": before or None, "tool_calls": tool_calls}, "tool_calls"
