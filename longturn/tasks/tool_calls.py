"""Tool calls in a reply, in the Hermes format ChatML models use:
`<tool_call>{"name": …, "arguments": {…}}</tool_call>`, any number per reply.

The model's text is only parsed as JSON (`json.loads`), never evaluated. A call that cannot be
used (bad JSON, no name, arguments that are not an object, a tag left open, a call past the
bounds below) comes back as a `BadToolCall` whose message becomes the tool result, so the episode
goes on and the model sees what it got wrong.

The model writes this text, so it is hostile input: the tags are found with `str.find` in one
left-to-right pass (linear in the reply, however many tags are left open), and each call's size,
nesting depth and number lengths are checked by linear scans before `json.loads` sees it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"

# Bounds on one call's JSON text, checked before decoding. Why each exists: the decoder recurses
# once per nesting level (RecursionError near 1,000 levels ends the run), Python refuses to
# convert an integer of more than 4,300 digits (ValueError), and decoding time grows with size.
# No real call comes near them: a calculator call is ~60 characters, 2 levels, a few digits.
MAX_CALL_CHARS = 32_768  # characters between <tool_call> and </tool_call>
MAX_DEPTH = 64  # objects and arrays inside one another
MAX_NUMBER_DIGITS = 100  # consecutive digits of a number (outside strings)
MAX_CALLS = 16  # tool calls one reply may make; more are one BadToolCall, not run


class _NotFinite(ValueError):
    """NaN, Infinity or a number too large for a float: JSON has no such number."""


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _decode(raw: str) -> Any:
    """json.loads that refuses NaN, Infinity and floats that overflow (a tool would get them)."""
    return json.loads(raw, parse_float=_finite, parse_constant=_finite)

# A JSON string, or an unterminated one up to the end: possessive, so a match never gives back
# what it took and every character is read once. Strings are cut out before brackets and digits
# are counted: text inside a string is neither nesting nor a number.
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_DIGITS = re.compile(r"[0-9]++")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BadToolCall:
    raw: str
    error: str


def bounds_problem(raw: str, what: str = "the tool call") -> str | None:
    """Why `raw` must not reach `json.loads` (too long, too deep, a number too long), or None."""
    if len(raw) > MAX_CALL_CHARS:
        return f"{what} is {len(raw):,} characters long; the limit is {MAX_CALL_CHARS:,}"
    outside = _STRING.sub('""', raw)
    digits = max(map(len, _DIGITS.findall(outside)), default=0)
    if digits > MAX_NUMBER_DIGITS:
        return f"a number in {what} has {digits:,} digits; the limit is {MAX_NUMBER_DIGITS}"
    brackets = _NOT_BRACKET.sub("", outside)
    depth = max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)
    if depth > MAX_DEPTH:
        return f"{what} nests objects and arrays {depth:,} deep; the limit is {MAX_DEPTH}"
    return None


def _one_call(raw: str) -> ToolCall | BadToolCall:
    problem = bounds_problem(raw)
    if problem is not None:
        return BadToolCall(raw, problem)
    try:
        data = _decode(raw)
    except _NotFinite as err:
        return BadToolCall(raw, f"{str(err)[:20]!r} is not a finite JSON number")
    except json.JSONDecodeError as err:
        return BadToolCall(raw, f"the tool call is not valid JSON ({err.msg} at character "
                                f"{err.pos})")
    except (ValueError, RecursionError) as err:  # past the bounds' reach: a message, not a crash
        return BadToolCall(raw, f"the tool call could not be decoded ({type(err).__name__})")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        return BadToolCall(raw, 'a tool call is a JSON object with a "name" string and an '
                                '"arguments" object')
    name, arguments = data["name"], data.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        problem = bounds_problem(arguments, f'the "arguments" string of tool {name!r}')
        if problem is not None:
            return BadToolCall(raw, problem)
        try:
            arguments = _decode(arguments)
        except _NotFinite as err:
            return BadToolCall(raw, f"{str(err)[:20]!r} is not a finite JSON number")
        except (ValueError, RecursionError):
            pass  # still a string: refused just below
    if not isinstance(arguments, dict):
        return BadToolCall(raw, f'the "arguments" of tool {name!r} must be a JSON object')
    return ToolCall(name, arguments)


def parse_tool_calls(text: str) -> list[ToolCall | BadToolCall]:
    """Every `<tool_call>` block of a reply, in order; an opening tag without its closing tag is
    a BadToolCall too (the first such tag: no closing tag follows it, nor any later one)."""
    calls: list[ToolCall | BadToolCall] = []
    pos = 0
    while (start := text.find(OPEN, pos)) != -1:
        if len(calls) == MAX_CALLS:
            calls.append(BadToolCall(text[start:], f"a reply may make at most {MAX_CALLS} tool "
                                                   "calls; the rest were not run"))
            break
        body = start + len(OPEN)
        end = text.find(CLOSE, body)
        if end == -1:
            calls.append(BadToolCall(text[start:], f"{OPEN} was never closed by {CLOSE}"))
            break
        calls.append(_one_call(text[body:end].strip()))
        pos = end + len(CLOSE)
    return calls
