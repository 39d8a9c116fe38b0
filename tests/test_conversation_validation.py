"""Prompt validation with the chat protocol counts the replies the model made: a task's worked
example (assistant messages among its first messages) is not the model's."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from endpoint_engines import ScriptedEngine
from longturn.engines.base import SamplingParams
from longturn.params.config import parse_params
from longturn.run.conversation_validation import (conversation_gate_failures,
                                                validate_conversation_tasks)
from longturn.run.validation import TaskValidation

ROOT = Path(__file__).resolve().parents[1]
SAMPLING = SamplingParams(max_new_tokens=48, temperature=1.0, top_p=1.0, top_k=0, seed=3)


def test_a_worked_example_is_no_reply_of_the_model(smollm2_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    params = parse_params({"env": {"tasks": ["arithmetic"]}, "rollout": {"protocol": "chat"}})
    engine = ScriptedEngine(tokenizer, lambda prompt: "ANSWER: 1")  # no tool call: one reply
    (result,) = validate_conversation_tasks(engine, tokenizer, params, SAMPLING, [1, 2, 3])
    assert all(s["assistant_turns"] == 1 for s in result.samples)
    assert result.metrics["turns"] == 3 and result.metrics["valid_action_ratio"] == 1.0
    assert result.metrics["prompt_tokens_max"] == max(len(s["prompt_ids"])
                                                      for s in result.samples) > 0


def test_a_task_whose_first_context_leaves_no_room_fails_both_gates(smollm2_tokenizer_dir):
    """No reply was made, so no reply passed: the ratio is 0, not NaN (which would pass)."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    params = parse_params({"env": {"tasks": ["arithmetic"]},
                           "rollout": {"protocol": "chat", "chat": {"max_tokens": 16}}})
    engine = ScriptedEngine(tokenizer, lambda prompt: "ANSWER: 1")
    (result,) = validate_conversation_tasks(engine, tokenizer, params, SAMPLING, [1, 2])
    assert result.metrics["turns"] == 0 and result.metrics["valid_action_ratio"] == 0.0
    failures = conversation_gate_failures([result], 0.5)
    assert len(failures) == 2 and "leaves no room for a reply" in failures[0]
    assert failures[1].endswith("valid-reply ratio 0.00 < validation.min_valid_action_ratio 0.50 "
                                "(no reply was made)")


def test_the_gate_says_when_the_rollout_did_not_count_tool_calls():
    """A slime Sample's record leaves its calls uncounted (NaN figures): the gate's reason must
    not read as a model that made no call."""
    nan = float("nan")
    metrics = {"prompt_fits_budget": True, "valid_action_ratio": 0.25, "turns": 4,
               "tool_calls_per_episode": nan, "tool_call_validity": nan}
    (failure,) = conversation_gate_failures([TaskValidation("calc", metrics=metrics)], 0.5)
    assert failure.endswith("(the rollout does not count tool calls)"), failure
    counted = {**metrics, "tool_calls_per_episode": 0.0}
    (failure,) = conversation_gate_failures([TaskValidation("calc", metrics=counted)], 0.5)
    assert failure.endswith("(no tool call was made)"), failure


def test_an_env_tasks_replies_that_name_no_action_fail_the_gate(smollm2_tokenizer_dir):
    """The env behind the interaction reads each reply as an action: replies that name none are
    invalid, as with the action protocol (they used to pass as replies without a failed call)."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    params = parse_params({
        "env": {"tasks": ["babyai_goto_text"], "workers": False, "step_timeout_s": None},
        "rollout": {"protocol": "chat", "chat": {
            "max_assistant_turns": 2,
            "interactions": str(ROOT / "configs/env_interactions.yaml")}}})
    engine = ScriptedEngine(tokenizer, lambda prompt: "I will look around first.")
    (result,) = validate_conversation_tasks(engine, tokenizer, params, SAMPLING, [1])
    assert result.metrics["turns"] == 2 and result.metrics["valid_action_ratio"] == 0.0
    (failure,) = conversation_gate_failures([result], 0.5)
    assert failure.endswith("valid-reply ratio 0.00 < validation.min_valid_action_ratio 0.50 "
                            "(2 of 2 replies named no valid action of the env)"), failure
