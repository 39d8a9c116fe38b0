"""`rollout.agent`: a user's agent plays each episode through the OpenAI chat API served on the
loopback, and each of its calls becomes a sample with exactly the tokens that call sent; an agent
that raises, hangs or returns nonsense aborts its own episode only."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from transformers import AutoTokenizer

import agents_for_tests
from endpoint_engines import RecordingEngine, ScriptedEngine
from longturn.engines.base import SamplingParams
from longturn.errors import SettingError
from longturn.params.config import ParamsError, parse_params
from longturn.rollout.chat_deltas import ChatDeltas
from longturn.rollout.sample_metrics import sample_metrics
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.samples import samples_from_episodes
from longturn.run.conversation_validation import validate_conversation_tasks
from longturn.algo.sample_scoring import audit_samples_file
from longturn.serve.agent_rollout import agent_rollout
from test_conversation_pipeline import toy_sequence_params
from test_pipeline_smoke import STAGES, _dvc, scratch_repo

SAMPLING = SamplingParams(max_new_tokens=48, temperature=1.0, top_p=1.0, top_k=0, seed=3)
CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"6*7"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir: str):
    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


def _run(agent: str, timeout_s: float = 60.0) -> ConversationRun:
    params = parse_params({"env": {"tasks": ["arithmetic_plain"]}, "rollout": {
        "protocol": "chat", "agent": agent, "agent_timeout_s": timeout_s}})
    return ConversationRun.from_params(params, progress=False)


def _scripted(tokenizer, answers: dict[str, int]) -> RecordingEngine:
    """A calculator call first; once a tool result is in the prompt, `ANSWER: n` with the n
    `answers` holds for the problem in the prompt."""
    tool_turn = tokenizer.encode("<|im_start|>tool", add_special_tokens=False)

    def reply(prompt: list[int]) -> str:
        if not any(prompt[i:i + len(tool_turn)] == tool_turn for i in range(len(prompt))):
            return f"I compute.\n{CALL}"
        text = tokenizer.decode(prompt)
        return f"ANSWER: {next(n for problem, n in answers.items() if problem in text)}"
    return RecordingEngine(ScriptedEngine(tokenizer, reply))


def test_the_react_example_plays_each_call_as_a_sample_of_what_it_sent(tokenizer):
    run = _run("examples.react_calculator_agent:agent")
    tasks = [run.record("arithmetic_plain", seed) for seed in (1, 2, 3)]
    # the first two answered right, the third wrong
    answers = {t["messages"][-1]["content"]: int(t["answer"]) + (k == 2)
               for k, t in enumerate(tasks)}
    engine = _scripted(tokenizer, answers)
    records = run.play(engine, tokenizer, SAMPLING, tasks, ["e0", "e1", "e2"])
    generated = dict((tuple(p), c) for p, c in engine.completions())
    assert len(generated) == 6  # two calls an episode
    for slot, (task, record) in enumerate(zip(tasks, records)):
        assert record["termination"] == "done" and not record["aborted"]
        assert record["assistant_turns"] == 2 and record["tool_calls"] == 1
        samples = samples_from_episodes([record])
        assert [s["replies"][0]["step"] for s in samples] == [0, 1]
        # GiGPO's anchor state of a call is what it sent: equal prompts, equal states
        states = [s["replies"][0]["observation"] for s in samples]
        assert states[0] != states[1] and all(s.startswith("prompt ") for s in states)
        assert {s["env_index"] for s in samples} == {slot}
        for sample in samples:  # the tokens the engine was given and gave, nothing else
            completion = generated[tuple(sample["prompt_ids"])]
            assert sample["response_ids"] == completion.token_ids
            assert sample["engine_logprobs"] == completion.logprobs
            assert sample["loss_mask"] == [1] * len(sample["response_ids"])
        # the first call sent the task's messages and the calculator, rendered as the project does
        deltas = ChatDeltas(tokenizer, tools=[_calculator()])
        assert samples[0]["prompt_ids"] == deltas.start(deltas.prepare(task["messages"]))
        # the second call's prompt holds the tool result the agent computed
        assert "42" in tokenizer.decode(samples[1]["prompt_ids"]).split("<|im_start|>tool")[1]
        # the reward is the task's own (the agent returned None), on the last call
        right = slot < 2
        assert [r["reward"] for s in samples for r in s["replies"]] == [0.0, float(right)]
        assert record["success"] is right
        answer = int(task["answer"]) + (not right)
        assert json.loads(record["messages"])[-1] == {"role": "assistant",
                                                      "content": f"ANSWER: {answer}"}


def test_an_agents_failed_tool_calls_count_by_the_rule_of_the_built_in_rollout(tokenizer):
    """The react agent runs its calculator itself: a call it refuses (`Error: division by
    zero`) is a failed call in `tool_errors` and makes its reply invalid, as the built-in
    rollout counts the calculator's own refusals, so tool-call validity and reply validity
    agree."""
    run = _run("examples.react_calculator_agent:agent")
    task = run.record("arithmetic_plain", 4)
    divide = CALL.replace("6*7", "1/0")
    engine = ScriptedEngine(tokenizer, lambda prompt: (
        "ANSWER: 3" if "division by zero" in tokenizer.decode(prompt) else f"Try.\n{divide}"))
    [record] = run.play(engine, tokenizer, SAMPLING, [task], ["e0"])
    assert (record["tool_calls"], record["tool_errors"]) == (1, 1)
    assert record["reply_valid"] == [False, True]
    m = sample_metrics(samples_from_episodes([record]))
    assert (m["tool_call_validity"], m["valid_action_ratio"]) == (0.0, 0.5)


def _calculator() -> dict:
    from examples.react_calculator_agent import CALCULATOR
    return CALCULATOR


def test_an_agents_replies_say_why_they_stopped_and_its_own_user_messages_are_user_turns(
        tokenizer):
    """Each call's reply carries the engine's finish reason (length: cut at the call's reply
    cap); the user message the agent added between its calls is a user turn, the task's own
    (a worked example's too) are not."""
    params = parse_params({"env": {"tasks": ["arithmetic"]}, "rollout": {
        "protocol": "chat", "agent": "agents_for_tests:asks_for_the_answer"}})
    run = ConversationRun.from_params(params, progress=False)
    engine = ScriptedEngine(tokenizer, lambda prompt: "Let me see. ANSWER: 1")
    records = run.play(engine, tokenizer, SAMPLING, [run.record("arithmetic", 1)], ["e0"])
    assert records[0]["user_turns"] == 1 and records[0]["assistant_turns"] == 2
    samples = samples_from_episodes(records)  # training's and evaluation's samples
    assert [s["replies"][0]["finish_reason"] for s in samples] == ["stop", "length"]
    assert samples[-1]["user_turns"] == 1
    assert sample_metrics(samples)["mean_user_turns"] == 1.0


def test_validation_of_an_agent_counts_its_first_context_and_the_replies_it_made(tokenizer):
    """validate_prompts plays whole episodes as packed samples: the prompt is what the agent's
    first call sent, and the replies are the model's two calls, not the task's worked example's
    two assistant messages as well."""
    params = parse_params({"env": {"tasks": ["arithmetic"]}, "rollout": {
        "protocol": "chat", "agent": "agents_for_tests:asks_for_the_answer"}})
    engine = RecordingEngine(ScriptedEngine(tokenizer, lambda prompt: "Let me see. ANSWER: 1"))
    (result,) = validate_conversation_tasks(engine, tokenizer, params, SAMPLING, [1, 2])
    first_prompts = [p for p, _ in engine.completions()  # without the agent's own message
                     if agents_for_tests.FINAL_ANSWER not in tokenizer.decode(p)]
    assert len(first_prompts) == 2
    assert sorted(s["prompt_ids"] for s in result.samples) == sorted(first_prompts)
    assert [[r["finish_reason"] for r in s["replies"]] for s in result.samples] == [
        ["stop", "length"]] * 2
    m = result.metrics
    assert m["prompt_tokens_max"] == max(map(len, first_prompts))
    assert m["prompt_tokens_mean"] == sum(map(len, first_prompts)) / 2
    assert m["turns"] == 4 and m["valid_action_ratio"] == 1.0 and m["mean_user_turns"] == 1.0


def test_an_agent_that_raises_or_returns_nonsense_aborts_only_its_episode(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda prompt: "ANSWER: 1")
    for name, reason in (("raises_after_a_call", "agent_error"), ("says_a_word", "agent_error")):
        run = _run(f"agents_for_tests:{name}")
        tasks = [run.record("arithmetic_plain", 5)]
        (record,) = run.play(engine, tokenizer, SAMPLING, tasks, ["e0"])
        assert record["termination"] == reason and record["aborted"] and not record["success"]
        (sample,) = samples_from_episodes([record])  # its one call, kept but out of the loss
        assert sample["replies"][0]["aborted"] and sample["replies"][0]["reward"] == 0.0


def test_replies_that_are_only_tool_calls_reach_the_task_reward_as_text(tokenizer):
    """The client drops `content` of a reply that is only a tool call: the task still reads a
    conversation in this project's format (every content a string)."""
    run = _run("examples.react_calculator_agent:agent")
    engine = ScriptedEngine(tokenizer, lambda prompt: CALL)  # never answers: 4 bare calls
    (record,) = run.play(engine, tokenizer, SAMPLING, [run.record("arithmetic_plain", 4)], ["e"])
    assert record["termination"] == "done" and record["assistant_turns"] == 4
    assert record["reward"] == 0.0 and not record["success"]
    assert all(isinstance(m["content"], str) for m in json.loads(record["messages"]))


def test_a_task_reward_that_fails_on_the_agents_messages_aborts_that_episode(tokenizer):
    run = _run("agents_for_tests:leaves_the_reward_to_the_task")
    run.settings.reward_fn = lambda task, messages: 1 / 0
    engine = ScriptedEngine(tokenizer, lambda prompt: "ANSWER: 1")
    (record,) = run.play(engine, tokenizer, SAMPLING, [run.record("arithmetic_plain", 4)], ["e"])
    assert record["termination"] == "agent_error" and record["aborted"]


def test_a_hung_agent_is_cut_off_and_the_others_finish(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda prompt: "ANSWER: 1")
    settings = _run("agents_for_tests:one_call").settings
    agents = {0: agents_for_tests.one_call, 1: agents_for_tests.hangs_after_a_call}

    def agent(task, base_url):
        return agents[task["slot"]](task, base_url)
    run = _run("agents_for_tests:one_call")
    tasks = [{**run.record("arithmetic_plain", 5), "slot": k} for k in (0, 1)]
    try:
        records = agent_rollout(engine, tokenizer, SAMPLING, tasks, settings, agent=agent,
                                timeout_s=3.0)
    finally:
        agents_for_tests.RELEASE.set()
    assert [r["termination"] for r in records] == ["done", "timeout"]
    assert [r["aborted"] for r in records] == [False, True]
    assert records[0]["segment_rewards"] == [0.5]  # the agent's own reward
    assert len(records[1]["segment_starts"]) == 1  # its call before it hung is kept


def test_an_agent_needs_the_chat_protocol_and_an_importable_function():
    with pytest.raises(ParamsError, match="set rollout.protocol: chat"):
        parse_params({"rollout": {"agent": "examples.react_calculator_agent:agent"}})
    with pytest.raises(ParamsError, match="rollout.chat.tools would not be read"):
        parse_params({"rollout": {"protocol": "chat", "agent": "a:b",
                                  "chat": {"tools": "configs/calculator_tools.yaml"}}})
    with pytest.raises(SettingError, match="rollout.agent 'examples.nowhere:agent'"):
        _run("examples.nowhere:agent")


def test_dvc_exp_run_of_the_agent_profile(tmp_path, tiny_model_dir):
    """The worked example end to end, as README runs it: every stage, with GAE in fixed-turn
    batches (exactly n_envs x turns_per_env calls an iteration, each call a sample of one reply
    at its slot's lock-step; the agents and the endpoint go on across the update), GAE
    recomputed from the files."""
    params = toy_sequence_params(tiny_model_dir, "agent")
    params["algo"] = {**params.get("algo", {}), "advantage": "gae"}
    params["rollout"].update(turns_per_env=2)
    params["train"].update(iterations=2)
    repo = scratch_repo(tmp_path, params)
    out = _dvc(repo, "exp", "run", "-n", "agent")
    for stage in STAGES:
        assert f"Running stage '{stage}'" in out
    for iteration in (0, 1):
        part = repo / f"data/train/trajectories/iteration={iteration:04d}/part-00.parquet"
        samples = pd.read_parquet(part)
        assert (samples["replies"].map(len) == 1).all() and samples["env_index"].notna().all()
        steps = samples.groupby("env_index")["replies"].agg(lambda r: sorted(x[0]["step"]
                                                                              for x in r))
        assert steps.tolist() == [[0, 1], [0, 1]]
        assert audit_samples_file(part) < 1e-4
    metrics = json.loads((repo / "data/eval/final/metrics.json").read_text())
    assert metrics["overall"]["episodes"] == 2
