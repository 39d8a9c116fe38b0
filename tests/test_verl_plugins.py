"""A verl user's files and classes as they are: tools and interaction YAML in verl's layout
(examples/sglang_multiturn/config of volcengine/verl) for this project's own classes, verl-style
async tools and interaction (tests/verl_style_plugins.py, only the import line changed) through
the ToolBox and the conversation rollout, calls of many episodes at once, a hanging or raising
tool as an `Error:` result, and one line naming file and entry for a bad entry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from longturn.errors import SettingError
from longturn.params.config import ChatParams
from longturn.rollout.conversation_rollout import conversation_rollout
from longturn.tasks.arithmetic import RevisionInteraction, make_problem, task_record
from longturn.tasks.calculator import CalculatorTool
from longturn.tasks.interactions import load_interactions
from longturn.tasks.tool_calls import ToolCall
from longturn.tasks.tools import ToolBox, load_tools
from tool_runs import run_call, run_calls
from longturn.tasks.verl_api import OpenAIFunctionToolSchema
from settings_from_params import conversation_settings, sampling_settings
from test_conversation_rollout import ScriptedEngine, call
import verl_style_plugins as plugins

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = "verl_style_plugins"

# verl's gsm8k_tool_config.yaml, keys and nesting as they are, naming this project's calculator
VERL_CALCULATOR = """\
tools:
  - class_name: "longturn.tasks.calculator.CalculatorTool"
    config:
      type: native
      max_length: 200
    tool_schema:
      type: "function"
      function:
        name: "calculator"
        description: "Evaluate an arithmetic expression."
        parameters:
          type: "object"
          properties:
            expression:
              type: "string"
              description: "The expression, e.g. 17 + 5 * 12"
          required: ["expression"]
"""

# verl's gsm8k_interaction_config.yaml, naming this project's revision interaction
VERL_REVISION = """\
interaction:
  - name: "revise"
    class_name: "longturn.tasks.arithmetic.RevisionInteraction"
    config: {}
"""


def verl_tool_yaml(cls: str, name: str, config: str = "", properties: str = "") -> str:
    """A tools file in verl's layout for one class of tests/verl_style_plugins.py."""
    return f"""\
tools:
  - class_name: "{PLUGINS}.{cls}"
    config:
      type: native
{config}
    tool_schema:
      type: "function"
      function:
        name: "{name}"
        description: "A test tool."
        parameters:
          type: "object"
          properties:
{properties or '            tag: {type: "string", description: "a label"}'}
          required: []
"""


ANSWER_TOOL = verl_tool_yaml("AnswerTool", "submit_answer", properties=(
    '            answer: {type: "string", description: "the final number"}'))
VERL_INTERACTION = f"""\
interaction:
  - name: "revise"
    class_name: "{PLUGINS}.ReviseInteraction"
    config: {{}}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir):
    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


# ---- deliverable 1: verl's files load as they are ---------------------------------------------

def test_verl_tool_config_loads_this_projects_calculator(tmp_path):
    [tool] = load_tools(write(tmp_path, "tools.yaml", VERL_CALCULATOR))
    assert isinstance(tool, CalculatorTool) and tool.config == {"max_length": 200}
    box = ToolBox([tool])
    assert box.schemas[0]["function"]["name"] == "calculator"
    box.create_many([("e", None)], None)
    assert run_call(box, "e", ToolCall("calculator", {"expression": "12 * 7"})).text == "84"
    assert run_call(box, "e", ToolCall("calculator", {})).error == "bad_arguments"


def test_verl_interaction_config_loads_this_projects_interaction(tmp_path):
    found = load_interactions(write(tmp_path, "interactions.yaml", VERL_REVISION))
    assert list(found) == ["revise"] and isinstance(found["revise"], RevisionInteraction)
    unnamed = VERL_REVISION.replace('  - name: "revise"\n    class_name', "  - class_name")
    assert list(load_interactions(write(tmp_path, "unnamed.yaml", unnamed))) == ["revision"]


def test_verl_tokenization_sanity_check_modes_are_accepted():
    assert ChatParams(tokenization_check="disable").tokenization_check == "off"
    for mode in ("strict", "ignore_strippable"):
        assert ChatParams(tokenization_check=mode).tokenization_check == mode
    with pytest.raises(ValueError, match="tokenization_check"):
        ChatParams(tokenization_check="loose")


@pytest.mark.parametrize("text, message", [
    (VERL_CALCULATOR.replace("    config:", "    class: x:Y\n    config:"),
     "tools[0]: both 'class' and verl's 'class_name': give one"),
    (VERL_CALCULATOR.replace("    config:", "    schema: {}\n    config:"),
     "tools[0]: both 'schema' and verl's 'tool_schema': give one"),
    (VERL_CALCULATOR.replace("    config:", "    tool_schemas: {}\n    config:"),
     "tools[0]: unknown key 'tool_schemas'"),
    (VERL_CALCULATOR.replace("type: native", "type: mcp"),
     "tools[0]: config.type 'mcp' is not supported"),
    (VERL_CALCULATOR.replace('    tool_schema:\n      type: "function"',
                             '    tool_schema:\n      type: "retrieval"'),
     "tools[0]: 'schema' must be an OpenAI function schema"),
    (VERL_CALCULATOR.replace("longturn.tasks.calculator.CalculatorTool",
                             "verl.tools.gsm8k_tool.Gsm8kTool"),
     "tools[0]: cannot import module 'verl.tools.gsm8k_tool'"),
    (ANSWER_TOOL.replace("AnswerTool", "_score"),
     "from longturn.tasks.verl_api import BaseTool"),
    (ANSWER_TOOL.replace('name: "submit_answer"', 'name: "submit_answer"\n        strict: "maybe"'),
     "tools[0]: tool_schema function.strict: Input should be a valid boolean"),
    (VERL_CALCULATOR.split("    tool_schema:")[0],
     "tools[0]: no 'tool_schema': CalculatorTool is this project's tool class"),
])
def test_a_bad_verl_tool_entry_is_one_line_naming_file_and_entry(tmp_path, text, message):
    path = write(tmp_path, "tools.yaml", text)
    with pytest.raises(SettingError, match=re.escape(message)) as err:
        load_tools(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


@pytest.mark.parametrize("text, message", [
    (VERL_REVISION + "interactions: []\n", "has both 'interactions' and verl's 'interaction'"),
    ("interaction: {name: x}\n", "needs a top-level 'interactions' (or verl's 'interaction') "
                                 "list"),
    (VERL_REVISION.replace("config: {}", "config: {}\n    kwargs: {}"),
     "interactions[0]: unknown key 'kwargs'"),
    (VERL_REVISION.replace("longturn.tasks.arithmetic.RevisionInteraction",
                           "longturn.tasks.arithmetic.make_problem"),
     "from longturn.tasks.verl_api import BaseInteraction"),
])
def test_a_bad_verl_interaction_entry_is_one_line(tmp_path, text, message):
    path = write(tmp_path, "interactions.yaml", text)
    with pytest.raises(SettingError, match=re.escape(message)) as err:
        load_interactions(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


# ---- deliverable 2: verl-style classes run ----------------------------------------------------

def test_a_verl_style_tool_runs_through_the_toolbox(tmp_path):
    [tool] = load_tools(write(tmp_path, "tools.yaml", ANSWER_TOOL))
    assert isinstance(tool, plugins.AnswerTool) and tool.config == {"type": "native"}
    assert isinstance(tool.tool_schema, OpenAIFunctionToolSchema)
    box = ToolBox([tool])
    assert box.schemas[0]["function"]["parameters"]["required"] == []
    box.create_many([("a", {"submit_answer": {"create_kwargs": {"ground_truth": "42"}}}),
                     ("b", {"submit_answer": {"create_kwargs": {"ground_truth": "7"}}})], 5.0)
    first, second = run_calls(box, [("a", ToolCall("submit_answer", {"answer": "41"})),
                                    ("b", ToolCall("submit_answer", {"answer": "7"}))], 5.0)
    assert (first.text, first.reward, first.error) == (
        "Current parsed answer='41' reward=0.0", -0.05, None)
    assert (second.reward, second.error) == (0.0, None)
    assert run_call(box, "a", ToolCall("submit_answer", {"answer": 5})).error == "bad_arguments"
    assert box.rewards_many(["a", "b"], 5.0) == [{"submit_answer": 0.0}, {"submit_answer": 1.0}]
    box.release_many(["a", "b"], 5.0)
    assert tool._instance_dict == {}


def test_many_episodes_calls_run_at_the_same_time(tmp_path):
    path = write(tmp_path, "tools.yaml", verl_tool_yaml("SleepyTool", "nap",
                                                        "      seconds: 0.3"))
    box = ToolBox(load_tools(path))
    plugins.SleepyTool.intervals.clear()
    results = run_calls(box, [(f"ep-{i}", ToolCall("nap", {"tag": str(i)})) for i in range(8)],
                        timeout_s=30.0)
    assert [r.text for r in results] == [f"slept {i}" for i in range(8)]  # in call order
    starts, ends = zip(*plugins.SleepyTool.intervals)
    assert len(starts) == 8 and max(starts) < min(ends)  # every call began before any ended


def test_a_hanging_tool_is_cut_off_and_a_raising_one_is_an_error(tmp_path):
    tools = (verl_tool_yaml("HangingTool", "hang")
             + verl_tool_yaml("RaisingTool", "boom").replace("tools:\n", "")
             + verl_tool_yaml("TaggedTextTool", "tagged").replace("tools:\n", ""))
    box = ToolBox(load_tools(write(tmp_path, "tools.yaml", tools)))
    hung, raised, tagged = run_calls(box, [("e", ToolCall("hang", {})),
                                           ("e", ToolCall("boom", {})),
                                           ("e", ToolCall("tagged", {}))], timeout_s=0.2)
    assert (hung.error, hung.text) == ("tool_timeout", "Error: hang did not return within 0.2 s")
    assert raised.error == "tool_exception"
    assert raised.text == "Error: boom failed: ConnectionError: the sandbox is down"
    assert tagged.error is None and tagged.text.startswith("<tool_call>")


def test_verl_style_tool_and_interaction_play_conversations(tmp_path, tokenizer):
    tools = ToolBox(load_tools(write(tmp_path, "tools.yaml", ANSWER_TOOL + verl_tool_yaml(
        "HangingTool", "hang").replace("tools:\n", "") + verl_tool_yaml(
        "TaggedTextTool", "tagged").replace("tools:\n", ""))))
    [interaction] = load_interactions(write(tmp_path, "i.yaml", VERL_INTERACTION)).values()
    assert interaction.config == {"name": "revise"} and interaction.name == "revise"
    tasks, script = [], {}
    for seed in (1, 2):
        record, answer = task_record(seed), str(make_problem(seed).answer)
        record["tools_kwargs"] = {"submit_answer": {"create_kwargs": {"ground_truth": answer}}}
        record["interaction_kwargs"] = {"name": "revise", "ground_truth": answer}
        tasks.append(record)
    one, two = (make_problem(s) for s in (1, 2))
    submit = call("0").replace('"calculator"', '"submit_answer"').replace("expression", "answer")
    hang = '<tool_call>\n{"name": "hang", "arguments": {}}\n</tool_call>'
    tagged = '<tool_call>\n{"name": "tagged", "arguments": {}}\n</tool_call>'
    script = {one.question: [submit, hang + tagged, f"ANSWER: {one.answer}"],
              two.question: ["ANSWER: -1", f"ANSWER: {two.answer}"]}
    settings = conversation_settings(tools=tools, interaction=interaction, max_assistant_turns=4,
                                     max_user_turns=2, max_tokens=2048, tool_timeout_s=0.5)
    sampling = sampling_settings(max_new_tokens=64, temperature=1.0, seed=0)
    first, second = conversation_rollout(ScriptedEngine(tokenizer, script), tokenizer, sampling,
                                         tasks, settings)
    messages = json.loads(first["messages"])
    assert messages[3] == {"role": "tool", "name": "submit_answer",
                           "content": "Current parsed answer='0' reward=0.0"}
    assert messages[5]["content"] == "Error: hang did not return within 0.5 s"
    assert messages[6]["content"].startswith('<tool_call>{"name": "hanging"')  # text, not a call
    assert messages[-1]["role"] == "assistant"
    assert (first["termination"], first["tool_calls"], first["tool_errors"]) == ("done", 3, 1)
    # the step reward -0.05, the interaction's score 1, the tool's episode reward 0 (its answer 0)
    assert first["reward"] == pytest.approx(0.95)
    assert json.loads(second["messages"])[3] == {
        "role": "user", "content": "Your response is incorrect! Try again."}
    assert (second["termination"], second["user_turns"], second["reward"]) == ("done", 1, 1.0)
    assert first["tokenization_check"] == second["tokenization_check"] == "identical"
    assert interaction._instance_dict == {} and tools.tools["submit_answer"]._instance_dict == {}


def test_a_tool_image_to_a_text_model_is_an_error(tmp_path, tokenizer):
    tools = ToolBox(load_tools(write(tmp_path, "tools.yaml",
                                     verl_tool_yaml("PictureTool", "picture"))))
    [result] = run_calls(tools, [("e", ToolCall("picture", {}))], 5.0)
    assert result.text == "a red square" and result.images[0].shape == (4, 4, 3)
    problem = make_problem(3)
    script = {problem.question: ['<tool_call>\n{"name": "picture", "arguments": {}}\n</tool_call>',
                                 "ANSWER: 1"]}
    settings = conversation_settings(tools=tools, max_assistant_turns=3)
    [rec] = conversation_rollout(ScriptedEngine(tokenizer, script), tokenizer,
                                 sampling_settings(max_new_tokens=32, temperature=1.0, seed=0),
                                 [task_record(3)], settings)
    assert json.loads(rec["messages"])[-2]["content"] == (
        "Error: picture returned an image, and this model reads no images")
