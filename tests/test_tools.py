"""Tool calls in Hermes format, the tools YAML, the calculator's safe evaluator, interactions and
the arithmetic task: every mistake of the model is a message, never a crash or an eval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longturn.errors import SettingError
from longturn.tasks.interactions import load_interactions
from longturn.tasks.tool_calls import (MAX_CALL_CHARS, MAX_CALLS, MAX_DEPTH, MAX_NUMBER_DIGITS,
                                           OPEN, CLOSE, BadToolCall, ToolCall, bounds_problem,
                                           parse_tool_calls)
from longturn.tasks.tools import BaseTool, ToolBox, load_tools
from tool_runs import run_call
from longturn.tasks.arithmetic import (RevisionInteraction, final_answer, make_problem, reward,
                                       task_record)
from longturn.tasks.calculator import CalculationError, evaluate, format_number

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "configs" / "calculator_tools.yaml"
INTERACTIONS = ROOT / "configs" / "revision_interactions.yaml"


def test_parse_hermes_calls_in_order_and_bad_ones_with_their_reason():
    text = ('I will compute. <tool_call>\n{"name": "calculator", "arguments": {"expression": '
            '"2+3"}}\n</tool_call> then <tool_call>{"name": "calculator", "arguments": '
            '"{\\"expression\\": \\"4*5\\"}"}</tool_call><tool_call>{name: calc}</tool_call>'
            '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "x", "arguments": [1]}'
            '</tool_call> and <tool_call>{"name": "calculator"')
    calls = parse_tool_calls(text)
    assert calls[0] == ToolCall("calculator", {"expression": "2+3"})
    assert calls[1] == ToolCall("calculator", {"expression": "4*5"})  # arguments as a JSON string
    assert isinstance(calls[2], BadToolCall) and "not valid JSON" in calls[2].error
    assert isinstance(calls[3], BadToolCall) and '"name" string' in calls[3].error
    assert isinstance(calls[4], BadToolCall) and "must be a JSON object" in calls[4].error
    assert isinstance(calls[5], BadToolCall) and "never closed" in calls[5].error
    assert parse_tool_calls("ANSWER: 5") == []


@pytest.mark.parametrize("expression, value", [
    ("2+3*4", 14), ("(2+3)*4", 20), ("7/2", 3.5), ("7//2", 3), ("-2**3", -8), ("17 % 5", 2),
    ("1.5 * 4", 6.0), ("  12 - 3  ", 9)])
def test_calculator_evaluates_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression, message", [
    ("__import__('os').system('echo hi')", "only numbers"),
    ("open('/etc/passwd').read()", "only numbers"),
    ("x + 1", "only numbers"), ("'a' * 3", "only numbers"), ("[1, 2]", "only numbers"),
    ("2 ** 1000", "exponents above 64"), ("10 ** 20", "out of range"), ("1/0", "division by zero"),
    ("2 +", "not an arithmetic expression"), ("1" * 300, "longer than 200"),
    ("(-8) ** 0.5", "out of range")])
def test_calculator_refuses_anything_else_with_a_reason(expression, message):
    with pytest.raises(CalculationError, match=message):
        evaluate(expression)


def test_format_number():
    assert format_number(6.0) == "6" and format_number(3.5) == "3.5"
    assert format_number(1 / 3) == "0.3333333333"


def test_toolbox_turns_every_model_mistake_into_an_error_result():
    box = ToolBox(load_tools(TOOLS))
    assert [s["function"]["name"] for s in box.schemas] == ["calculator"]
    box.create_many([("ep-1", None)], None)
    ok = run_call(box, "ep-1", ToolCall("calculator", {"expression": "12 * 7"}))
    assert (ok.text, ok.error, ok.metrics) == ("84", None, {"calculator_ok": 1})
    assert run_call(box, "ep-1", ToolCall("calculator", {"expression": "1/0"})).text == \
        "Error: division by zero"
    unknown = run_call(box, "ep-1", ToolCall("search", {"q": "x"}))
    assert unknown.error == "unknown_tool" and "calculator" in unknown.text
    missing = run_call(box, "ep-1", ToolCall("calculator", {}))
    assert missing.error == "bad_arguments" and "'expression' is a required property" in missing.text
    extra = run_call(box, "ep-1", ToolCall("calculator", {"expression": "1", "mode": "x"}))
    assert extra.error == "bad_arguments"
    wrong_type = run_call(box, "ep-1", ToolCall("calculator", {"expression": 5}))
    assert wrong_type.error == "bad_arguments" and "expression" in wrong_type.text
    bad = run_call(box, "ep-1", BadToolCall("{", "the tool call is not valid JSON"))
    assert bad.error == "bad_call" and bad.text.startswith("Error: the tool call is not valid JSON")
    assert box.rewards_many(["ep-1"], None) == [{"calculator": 0.0}]
    box.release_many(["ep-1"], None)
    assert box.tools["calculator"].instances == {}


class Exploding(BaseTool):
    def execute(self, instance_id, parameters):
        raise RuntimeError("disk on fire")


def test_a_tool_that_raises_gives_an_error_result(tmp_path):
    schema = {"type": "function", "function": {"name": "boom", "parameters": {
        "type": "object", "properties": {}}}}
    box = ToolBox([Exploding({}, schema)])
    result = run_call(box, "e", ToolCall("boom", {}))
    assert result.error == "tool_exception" and "RuntimeError: disk on fire" in result.text


@pytest.mark.parametrize("text, message", [
    ("nothing: here\n", "top-level 'tools' list"),
    ("tools: [{class: longturn.tasks.calculator:CalculatorTool}]", "OpenAI function schema"),
    ("tools: [{class: no.such.module:X, schema: {type: function, function: {name: a}}}]",
     "cannot import module 'no.such.module'"),
    ("tools: [{class: 'longturn.tasks.calculator:Nope', schema: {type: function, function: "
     "{name: a}}}]", "has no 'Nope'"),
    ("tools: [{class: 'longturn.tasks.calculator:evaluate', schema: {type: function, function: "
     "{name: a}}}]", "is not a tool class: subclass longturn.tasks.tools.BaseTool"),
    ("tools: [{class: 'longturn.tasks.calculator:CalculatorTool', schema: {type: function, "
     "function: {name: a, parameters: {type: 12}}}}]", "not a JSON Schema"),
    ("tools: [\n", "not valid YAML"),
    ("tools: [{class: 'longturn.tasks.calculator:CalculatorTool', config: {max_length: big}, "
     "schema: {type: function, function: {name: a}}}]", "limits must be numbers"),
])
def test_bad_tools_file_names_file_and_entry(tmp_path, text, message):
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    with pytest.raises(SettingError, match=message):
        load_tools(path)
    with pytest.raises(SettingError, match="does not exist"):
        load_tools(tmp_path / "missing.yaml")


def test_problems_are_seeded_integral_and_right():
    assert make_problem(7) == make_problem(7)
    questions = {make_problem(s).question for s in range(50)}
    assert len(questions) == 50
    for s in range(200):
        p = make_problem(s)
        expected = evaluate(p.expression)
        assert float(expected).is_integer() and int(expected) == p.answer, p
    record = task_record(3)
    assert record["messages"][-1]["content"] == make_problem(3).question
    assert record["interaction_kwargs"] == {"answer": make_problem(3).answer}


def test_reward_reads_the_last_answer_line():
    assert final_answer("ANSWER: 1,204") == 1204 and final_answer("no number") is None
    assert reward("first ANSWER: 3\nno wait, answer: 42", 42) == 1.0
    assert reward("ANSWER: 41", 42) == 0.0 and reward("", 42) == 0.0


def test_revision_interaction_asks_once_then_ends():
    interaction = load_interactions(INTERACTIONS)["revise"]
    assert isinstance(interaction, RevisionInteraction)
    interaction.start("a", answer=42)
    done, text, score, _ = interaction.generate_response(
        "a", [{"role": "assistant", "content": "ANSWER: 41"}])
    assert (done, score) == (False, 0.0) and "not right" in text
    done, text, score, metrics = interaction.generate_response(
        "a", [{"role": "assistant", "content": "hmm"}])
    assert (done, score, metrics) == (True, 0.0, {"revisions": 1})
    interaction.start("b", answer=42)
    assert interaction.generate_response("b", [{"role": "assistant", "content": "ANSWER: 42"}])[:3] \
        == (True, "Correct.", 1.0)
    interaction.finalize("b")
    assert "b" not in interaction.instances


# ---- hostile replies: bounded before decoding, linear scanning, nothing escapes ---------------

def named_call(arguments_json: str) -> str:
    return '<tool_call>{"name": "calculator", "arguments": %s}</tool_call>' % arguments_json


@pytest.mark.parametrize("text, message", [
    (named_call("[" * 1000 + "]" * 1000), "nests objects and arrays 1,001 deep; the limit is 64"),
    (named_call('{"a": ' * 1000 + "1" + "}" * 1000), "1,001 deep"),
    (named_call("[" * 1000), "1,001 deep"),  # unbalanced: the decoder would recurse just the same
    (named_call('{"x": %s}' % ("9" * 5000)), "has 5,000 digits; the limit is 100"),
    (named_call('{"x": 0.%s}' % ("1" * 101)), "has 101 digits"),
    (named_call('{"x": "%s"}' % ("y" * MAX_CALL_CHARS)), "characters long; the limit is 32,768"),
    (named_call(json.dumps("[" * 100)), 'the "arguments" string of tool \'calculator\' nests'),
    (named_call('{"x": NaN}'), "'NaN' is not a finite JSON number"),
    (named_call('{"x": -Infinity}'), "'-Infinity' is not a finite JSON number"),
    (named_call('{"x": 1e999999}'), "'1e999999' is not a finite JSON number"),
    (named_call(json.dumps('{"x": 1e400}')), "'1e400' is not a finite JSON number"),
])
def test_probe_calls_are_bad_calls_with_the_bound_they_broke(text, message):
    [call] = parse_tool_calls(text)
    assert isinstance(call, BadToolCall) and message in call.error


def test_bounds_are_exact_and_ignore_what_is_inside_strings():
    def nested(levels: int) -> str:  # the call object and its arguments are two more levels
        return named_call('{"x": %s}' % ("[" * levels + "]" * levels))

    assert parse_tool_calls(nested(MAX_DEPTH - 2))[0] == ToolCall(
        "calculator", {"x": json.loads("[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2))})
    assert "65 deep" in parse_tool_calls(nested(MAX_DEPTH - 1))[0].error
    assert parse_tool_calls(named_call('{"x": %s}' % ("9" * MAX_NUMBER_DIGITS)))[0] == ToolCall(
        "calculator", {"x": int("9" * MAX_NUMBER_DIGITS)})
    # brackets, digits and escaped quotes inside a string are text, not nesting or numbers
    text = '[[[[' * 100 + '\\"' + "7" * 5000 + '\\\\'
    assert parse_tool_calls(named_call(json.dumps({"expression": text}))) == [
        ToolCall("calculator", {"expression": text})]
    assert bounds_problem('"unterminated \\" [[[' + "1" * 500) is None  # json.loads reports it


def test_a_reply_runs_at_most_max_calls_and_says_so():
    calls = parse_tool_calls(named_call('{"expression": "1+1"}') * (MAX_CALLS + 5))
    assert len(calls) == MAX_CALLS + 1
    assert all(isinstance(c, ToolCall) for c in calls[:MAX_CALLS])
    assert f"at most {MAX_CALLS} tool calls" in calls[-1].error


def test_ten_thousand_unclosed_tags_are_one_bad_call_found_in_one_pass():
    class CountingText(str):
        """Counts the characters each `find` reads (from its start to the match's end)."""
        read = 0

        def find(self, sub, start=0, *rest):
            at = super().find(sub, start, *rest)
            CountingText.read += (len(self) if at == -1 else at + len(sub)) - start
            return at

    text = CountingText(named_call("{}") + " x " + OPEN * 10_000 + '{"name": "a"}')
    calls = parse_tool_calls(text)
    assert calls[0] == ToolCall("calculator", {}) and len(calls) == 2
    assert isinstance(calls[1], BadToolCall) and "never closed" in calls[1].error
    assert calls[1].raw == OPEN * 10_000 + '{"name": "a"}'
    assert 0 < CountingText.read <= len(text)  # the tags are found by find, no character twice


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                               max_size=4),
    max_leaves=12)
FRAGMENTS = st.sampled_from([OPEN, CLOSE, "{", "}", "[", "]", '"', "\\", ":", ",", " ", "\n",
                             '"name"', '"calculator"', '"arguments"', "1" * 120, "-1e5", "null",
                             "[" * 70, "]" * 70, "\u2028", "\x00"])


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(), st.lists(FRAGMENTS | st.text(max_size=5)).map("".join)))
def test_no_text_makes_the_parser_raise(text):
    assert all(isinstance(c, (ToolCall, BadToolCall)) for c in parse_tool_calls(text))


@settings(max_examples=150, deadline=None)
@given(JSON_VALUES, st.text(min_size=1, max_size=10), st.integers(0, 80), st.booleans())
def test_random_json_in_tags_is_decoded_or_refused_with_a_reason(value, name, depth, as_string):
    arguments = {"v": value}
    for _ in range(depth):
        arguments = {"v": [arguments]}
    encoded = json.dumps({"name": name, "arguments": json.dumps(arguments) if as_string
                          else arguments})
    calls = parse_tool_calls(f"before {OPEN}{encoded}{CLOSE} after")
    if CLOSE in encoded or OPEN in encoded:  # a name may hold the tags themselves
        return
    [call] = calls
    if bounds_problem(encoded) is None and (not as_string or bounds_problem(json.dumps(arguments))
                                            is None):
        assert call == ToolCall(name, arguments)
    else:
        assert isinstance(call, BadToolCall) and "the limit is" in call.error
