"""An OpenAI chat-completions request, checked and turned into what the chat template renders.

Why a checker of its own: an agent's request is input from code this project did not write, and a
request the endpoint misreads would be trained on. So every field the endpoint uses is checked
here, a bad one is refused with a 4xx naming it (the OpenAI error shape), and nothing of a
refused request reaches the engine or the record. What is honoured, recorded only or refused:
docs/openai-endpoint.md, "What a request may ask"; `temperature`, `top_p` and `seed` are
checked but the run's sampling is used, as the policy is trained on its own distribution.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

ROLES = ("system", "developer", "user", "assistant", "tool")


class RequestError(Exception):
    """A request the endpoint refuses: HTTP status, OpenAI error type, the field it names."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": None}}


@dataclass(frozen=True)
class ChatRequest:
    """What the endpoint renders and samples for one call."""

    messages: list[dict[str, Any]]  # the project's message dicts, before the tool preamble
    tools: list[dict[str, Any]]
    max_new_tokens: int  # the reply's cap: the request's, within the run's
    read_tool_calls: bool  # tool_choice none: the reply is returned as text
    requested: dict[str, Any]  # the sampling fields the request asked for (recorded, not used)


def _text(value: Any, where: str, allow_none: bool = False) -> str | None:
    """A message's content: a string, or a list of text parts joined by newlines."""
    if value is None and allow_none:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        texts = []
        for k, part in enumerate(value):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise RequestError(f"{where}[{k}] is a {kind!r} part; only text parts are served",
                                   f"{where}[{k}]")
            if not isinstance(part.get("text"), str):
                raise RequestError(f"{where}[{k}].text must be a string", f"{where}[{k}].text")
            texts.append(part["text"])
        return "\n".join(texts)
    raise RequestError(f"{where} must be a string or a list of text parts", where)


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise RequestError(f"{where} must be a JSON object (as a string)", where)
    return value


def hermes_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One call in the format the model writes (`tasks.tool_calls`)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': dict(arguments)})}\n</tool_call>"


def _assistant(message: Mapping[str, Any], where: str, replies: Mapping[str, str],
               call_names: dict[str, str]) -> dict[str, Any]:
    content = _text(message.get("content"), f"{where}.content", allow_none=True)
    calls = message.get("tool_calls")
    if calls is None:
        if content is None:
            raise RequestError(f"{where} has neither content nor tool_calls", f"{where}.content")
        return {"role": "assistant", "content": content}
    if not isinstance(calls, list) or not calls:
        raise RequestError(f"{where}.tool_calls must be a non-empty list", f"{where}.tool_calls")
    written, ids = [], []
    for k, call in enumerate(calls):
        at = f"{where}.tool_calls[{k}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise RequestError(f"{at}.function.name must be a string", f"{at}.function.name")
        call_id = call.get("id")
        if not isinstance(call_id, str):
            raise RequestError(f"{at}.id must be a string", f"{at}.id")
        arguments = _arguments(function.get("arguments", "{}"), f"{at}.function.arguments")
        call_names[call_id] = function["name"]
        ids.append(call_id)
        written.append(hermes_call(function["name"], arguments))
    known = {replies.get(i) for i in ids}
    if len(known) == 1 and None not in known:  # the endpoint's own reply: its exact text
        return {"role": "assistant", "content": known.pop()}
    return {"role": "assistant", "content": "\n".join(([content] if content else []) + written)}


def _message(message: Any, where: str, replies: Mapping[str, str],
             call_names: dict[str, str]) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise RequestError(f"{where} must be an object", where)
    role = message.get("role")
    if role not in ROLES:
        raise RequestError(f"{where}.role is {role!r}; one of {', '.join(ROLES)}", f"{where}.role")
    if role == "assistant":
        return _assistant(message, where, replies, call_names)
    content = _text(message.get("content"), f"{where}.content")
    if role == "tool":
        # a tool result names its call; one written without a call (a task's worked example,
        # longturn's own message format) names its tool instead
        call_id, name = message.get("tool_call_id"), message.get("name")
        if not isinstance(call_id, str) and not isinstance(name, str):
            raise RequestError(f"{where}.tool_call_id must be a string (or, for a result "
                               "without a call, name the tool in `name`)", f"{where}.tool_call_id")
        name = name or call_names.get(call_id) or "tool"
        return {"role": "tool", "name": name, "content": content}
    return {"role": "system" if role == "developer" else role, "content": content}


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestError("tools must be a list of function schemas", "tools")
    for k, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if (not isinstance(tool, Mapping) or tool.get("type") != "function"
                or not isinstance(function, Mapping) or not isinstance(function.get("name"), str)):
            raise RequestError(f"tools[{k}] must be {{type: function, function: {{name, "
                               "description, parameters}}}}", f"tools[{k}]")
    return [dict(tool) for tool in value]


def _positive_int(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(f"{key} must be a positive integer, got {value!r}", key)
    return value


def _number(body: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not low <= value <= high):
        raise RequestError(f"{key} must be a number in [{low:g}, {high:g}], got {value!r}", key)
    return float(value)


def _refuse_unserved(body: Mapping[str, Any]) -> bool:
    """Refuse what the endpoint cannot do faithfully; returns whether to read tool calls."""
    if body.get("n") not in (None, 1):
        raise RequestError(f"n must be 1 (one reply per call is one training sample), got "
                           f"{body.get('n')!r}", "n")
    if body.get("stream"):
        raise RequestError("stream is not served; call without stream=True", "stream")
    if body.get("stop"):
        raise RequestError("stop sequences are not served: a reply ends at the model's "
                           "end-of-turn token or max_completion_tokens", "stop")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, Mapping) or fmt.get("type") != "text"):
        raise RequestError("response_format other than text is not served", "response_format")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise RequestError(f"tool_choice {choice!r} is not served; auto or none",
                           "tool_choice")
    return choice != "none"


def parse_request(body: Any, max_new_tokens: int, replies: Mapping[str, str]) -> ChatRequest:
    """The request `body` (decoded JSON) checked and converted; `replies` maps each tool-call id
    this endpoint issued in the episode to the reply text that made it."""
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object")
    if not isinstance(body.get("model"), str):
        raise RequestError("model must be a string (any name: one model is served)", "model")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages must be a non-empty list", "messages")
    read_calls = _refuse_unserved(body)
    names: dict[str, str] = {}
    messages = [_message(m, f"messages[{i}]", replies, names) for i, m in enumerate(raw)]
    newer, older = _positive_int(body, "max_completion_tokens"), _positive_int(body, "max_tokens")
    asked = newer or older
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"seed must be an integer, got {seed!r}", "seed")
    requested = {"temperature": _number(body, "temperature", 0.0, 2.0),
                 "top_p": _number(body, "top_p", 0.0, 1.0),
                 "seed": seed, "max_tokens": asked}
    return ChatRequest(messages=messages, tools=_tools(body.get("tools")),
                       max_new_tokens=min(asked or max_new_tokens, max_new_tokens),
                       read_tool_calls=read_calls, requested=requested)
