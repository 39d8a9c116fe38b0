"""verl's own GSM8K tool and interaction (tests/verl_gsm8k/: verl's files, only their import lines
changed; their YAML configs, only `class_name` changed) on the built-in `arithmetic_gsm8k` task:
verl's scorer semantics, verl's per-row kwargs reaching `create` and `start_interaction`, whole
episodes through the conversation rollout, and a toy `dvc exp run`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from transformers import AutoTokenizer

from longturn.rollout.conversation_rollout import conversation_rollout
from longturn.tasks import verl_api
from longturn.tasks.arithmetic import make_problem
from longturn.tasks.gsm8k_score import compute_score, extract_solution
from longturn.tasks.interactions import load_interactions
from longturn.tasks.registry import load_task
from longturn.tasks.tool_calls import ToolCall
from longturn.tasks.tools import ToolBox, load_tools
from tool_runs import run_calls
from settings_from_params import conversation_settings, sampling_settings
from test_conversation_pipeline import toy_sequence_params
from test_conversation_rollout import ScriptedEngine
from test_pipeline_smoke import STAGES, _dvc, _git, scratch_repo
from verl_gsm8k.gsm8k_interaction import Gsm8kInteraction
from verl_gsm8k.gsm8k_tool import Gsm8kTool

FIXTURES = Path(__file__).resolve().parent / "verl_gsm8k"
TOOLS = FIXTURES / "gsm8k_tool_config.yaml"
INTERACTIONS = FIXTURES / "gsm8k_interaction_config.yaml"
TASK = "arithmetic_gsm8k"
WRONG = "Your response is incorrect! You need to reflect on your answer and try again."


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir):
    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


@pytest.mark.parametrize("text, method, expected", [
    ("so 3 + 4 = 7\n#### 7", "strict", "7"),
    ("#### 1,234", "strict", "1234"),                   # strict drops commas
    ("#### -12.5 then #### 8", "strict", "8"),          # the last one
    ("the answer is 7", "strict", None),                # strict wants the format
    ("####7", "strict", None),                          # a space after ####
    ("the answer is 1,234", "flexible", "1,234"),       # flexible keeps the text as it is
    ("got 12, then 15.", "flexible", "15."),            # a trailing dot is part of it
    ("end .", "flexible", "."),                         # only dots: verl keeps the first
    ("nothing here", "flexible", None),
    ("#### 9" + " x" * 200, "strict", None),            # only the last 300 characters are read
])
def test_the_gsm8k_scorer_reads_answers_as_verl_does(text, method, expected):
    assert extract_solution(text, method) == expected


def test_the_gsm8k_scores_are_verls():
    assert compute_score("#### 42", "42") == 1.0
    assert compute_score("#### 41", "42", format_score=0.1) == 0.1  # formatted, wrong
    assert compute_score("42", "42", format_score=0.1) == 0       # strict: no answer at all
    assert compute_score("it is 42.", "42", method="flexible") == 0.0  # "42." is not "42"
    assert compute_score("it is 42 .", "42", method="flexible", score=2.0) == 2.0
    assert compute_score("#### 42", 42) == 0.0  # compared as text, as verl does
    with pytest.raises(ValueError, match="method"):
        extract_solution("#### 1", "loose")
    assert verl_api.gsm8k.compute_score is compute_score  # the import line verl's files use


def test_verls_yaml_builds_verls_classes():
    [tool] = load_tools(TOOLS)
    assert type(tool) is Gsm8kTool and tool.name == "calc_gsm8k_reward"
    assert tool.config == {"type": "native"}
    interactions = load_interactions(INTERACTIONS)
    assert list(interactions) == ["gsm8k"] and type(interactions["gsm8k"]) is Gsm8kInteraction
    assert interactions["gsm8k"].config == {"name": "gsm8k"}


def test_a_task_row_reaches_create_as_verls_create_kwargs():
    record = load_task(TASK).record(4)
    truth = str(make_problem(4).answer)
    assert record["tools_kwargs"] == {"calc_gsm8k_reward": {"create_kwargs": {
        "ground_truth": truth}}}
    assert record["interaction_kwargs"] == {"name": "gsm8k", "query": record["messages"][-1][
        "content"], "ground_truth": truth}
    box = ToolBox(load_tools(TOOLS))
    tool = box.tools["calc_gsm8k_reward"]
    box.create_many([("e", record["tools_kwargs"])], 5.0)
    assert tool._instance_dict["e"]["ground_truth"] == truth
    first, second = run_calls(box, [("e", ToolCall("calc_gsm8k_reward", {"answer": "-1"})),
                                    ("e", ToolCall("calc_gsm8k_reward", {"answer": truth}))], 5.0)
    assert (first.text, first.reward) == ("Current parsed answer='-1' reward=0.0", -0.05)
    assert (second.text, second.reward) == (f"Current parsed answer='{truth}' reward=1.0", 0.0)
    assert box.rewards_many(["e"], 5.0) == [{"calc_gsm8k_reward": 1.0}]
    box.release_many(["e"], 5.0)
    assert tool._instance_dict == {}


def submit(answer: str) -> str:
    return ('<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "%s"}}\n'
            "</tool_call>" % answer)


def test_verls_gsm8k_tool_and_interaction_play_episodes(tokenizer):
    """Three episodes at once: a checked right answer; a wrong `####` answer then a right one
    without `####` then a right one; never the format."""
    task = load_task(TASK)
    records = [{**task.record(seed), "task": TASK, "seed": seed} for seed in (1, 2, 3)]
    one, two, three = (make_problem(s) for s in (1, 2, 3))
    demo = 2  # the worked exchange's assistant turns come first in every prompt
    script = {one.question: [""] * demo + [submit(one.answer), f"so\n#### {one.answer}"],
              two.question: [""] * demo + ["#### -1", f"It is {two.answer}.",
                                           f"#### {two.answer}"],
              three.question: [""] * demo + [f"It is {three.answer}."]}
    [interaction] = load_interactions(INTERACTIONS).values()
    settings = conversation_settings(tools=ToolBox(load_tools(TOOLS)), interaction=interaction,
                                     max_assistant_turns=4, max_user_turns=2, max_tokens=2048,
                                     tool_timeout_s=5.0,
                                     reward_fn=task.reward)
    right, revised, never = conversation_rollout(
        ScriptedEngine(tokenizer, script), tokenizer,
        sampling_settings(max_new_tokens=64, temperature=1.0, seed=0), records, settings)
    played = [json.loads(r["messages"])[len(records[0]["messages"]):]
              for r in (right, revised, never)]
    assert played[0][1] == {"role": "tool", "name": "calc_gsm8k_reward",
                            "content": f"Current parsed answer='{one.answer}' reward=1.0"}
    assert played[0][-1]["content"].endswith(f"#### {one.answer}")
    # the interaction's score 1 and the tool's episode reward 1 (its last answer was right)
    assert (right["termination"], right["tool_calls"], right["reward"]) == ("done", 1, 2.0)
    assert [m["content"] for m in played[1] if m["role"] == "user"] == [WRONG, WRONG]
    assert (revised["termination"], revised["user_turns"], revised["reward"]) == ("done", 2, 1.0)
    assert (never["termination"], never["reward"]) == ("max_user_turns", 0.0)
    assert [m["content"] for m in played[2] if m["role"] == "user"] == [WRONG, WRONG]
    assert {r["tokenization_check"] for r in (right, revised, never)} == {"identical"}
    assert interaction._instance_dict == {}
    assert settings.tools.tools["calc_gsm8k_reward"]._instance_dict == {}
    assert task.success(records[1], json.loads(revised["messages"]))
    assert not task.success(records[2], json.loads(never["messages"]))


def test_dvc_exp_run_with_verls_gsm8k_files(tmp_path, tiny_model_dir):
    """verl's files in a project of one's own: the classes in a package, the YAMLs in configs/,
    every stage through `dvc exp run` at toy size."""
    params = toy_sequence_params(tiny_model_dir)
    params["env"]["tasks"] = [TASK]
    params["eval"]["tasks"] = [TASK]
    params["rollout"]["chat"].update(
        tools="configs/gsm8k_tool_config.yaml",
        interactions="configs/gsm8k_interaction_config.yaml", interaction="gsm8k",
        tokenization_check="disable", max_user_turns=1,
        max_tokens=800)  # room after the ~470-token prompt (verl's long tool description)
    repo = scratch_repo(tmp_path, params)
    shutil.copytree(FIXTURES, repo / "verl_gsm8k", ignore=shutil.ignore_patterns("__pycache__"))
    for path in (TOOLS, INTERACTIONS):
        shutil.copy(path, repo / "configs" / path.name)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "verl's files")
    out = _dvc(repo, "exp", "run", "-n", "verl_gsm8k")
    for stage in STAGES:
        assert f"Running stage '{stage}'" in out
    for side in ("zero_shot", "final"):
        metrics = json.loads((repo / f"data/eval/{side}/metrics.json").read_text())
        assert metrics["overall"]["episodes"] == 2 and set(metrics["tasks"]) == {TASK}
    samples = pd.read_parquet(repo / "data/train/trajectories/iteration=0000/part-00.parquet")
    conversations = [json.loads(m) for m in samples["messages"]]
    # every reply without a tool call went to verl's interaction, which answered as the user
    users = [m["content"] for c in conversations for m in c[6:] if m["role"] == "user"]
    assert users and set(users) == {WRONG} and (samples["user_turns"] >= 1).any()
