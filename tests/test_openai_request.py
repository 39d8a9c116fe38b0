"""An OpenAI chat request read into the messages the template renders, and a reply written back
as an OpenAI message: what is honoured, what is refused (naming the field)."""

from __future__ import annotations

import json

import pytest

from longturn.serve.openai_reply import reply_message
from longturn.serve.openai_request import RequestError, hermes_call, parse_request


def _request(messages, **fields):
    return {"model": "m", "messages": messages, **fields}


def test_roles_parts_tool_names_and_caps():
    parsed = parse_request(_request([
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "calc", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
    ], max_completion_tokens=500, temperature=0.0, tool_choice="none"), 64, {})
    assert parsed.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": hermes_call("calc", {"x": 1})},
        {"role": "tool", "name": "calc", "content": "1"}]
    assert parsed.max_new_tokens == 64  # the run's cap wins
    assert parsed.requested["temperature"] == 0.0 and parsed.read_tool_calls is False


def test_an_assistant_message_the_endpoint_answered_renders_as_the_model_wrote_it():
    raw = 'thinking <tool_call>{"name":"calc","arguments":{"x":1}}</tool_call>'
    parsed = parse_request(_request([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "thinking", "tool_calls": [
            {"id": "call_0_0", "type": "function",
             "function": {"name": "calc", "arguments": '{"x": 1}'}}]}]), 64, {"call_0_0": raw})
    assert parsed.messages[1] == {"role": "assistant", "content": raw}


@pytest.mark.parametrize("fields, param", [
    ({"stop": ["\n"]}, "stop"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"temperature": 3}, "temperature"),
    ({"seed": "x"}, "seed"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"model": 3}, "model"),
    ({"max_completion_tokens": True}, "max_completion_tokens"),
])
def test_unserved_fields_are_refused_by_name(fields, param):
    with pytest.raises(RequestError) as err:
        parse_request(_request([{"role": "user", "content": "q"}], **fields), 64, {})
    assert err.value.param == param and err.value.status == 400


@pytest.mark.parametrize("message, param", [
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
     "messages[0].content[0]"),
    ({"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f",
                                                                    "arguments": "[1]"}}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"role": "assistant", "content": None}, "messages[0].content"),
    ("hello", "messages[0]"),
])
def test_bad_messages_are_refused_by_path(message, param):
    with pytest.raises(RequestError) as err:
        parse_request(_request([message]), 64, {})
    assert err.value.param == param


def test_a_reply_is_tool_calls_only_when_every_call_parses():
    good = 'ok <tool_call>{"name": "calc", "arguments": {"x": 2}}</tool_call>'
    message, finish = reply_message(good, "stop", True, 4)
    assert finish == "tool_calls" and message["content"] == "ok"
    assert message["tool_calls"] == [{"id": "call_4_0", "type": "function", "function": {
        "name": "calc", "arguments": json.dumps({"x": 2})}}]
    broken = good + " <tool_call>{oops</tool_call>"
    assert reply_message(broken, "stop", True, 4) == ({"role": "assistant", "content": broken},
                                                      "stop")
    assert reply_message(good, "length", False, 4)[1] == "length"  # tool_choice none: text


def test_a_tool_result_without_a_call_names_its_tool_as_longturn_tasks_write_it():
    """A task's worked example (arithmetic's) has tool results written without a call id."""
    example = [{"role": "user", "content": "q"},
               {"role": "assistant", "content": hermes_call("calculator", {"expression": "1"})},
               {"role": "tool", "name": "calculator", "content": "1"}]
    assert parse_request(_request(example), 64, {}).messages[-1] == {
        "role": "tool", "name": "calculator", "content": "1"}
    with pytest.raises(RequestError, match="tool_call_id must be a string"):
        parse_request(_request([{"role": "tool", "content": "1"}]), 64, {})
