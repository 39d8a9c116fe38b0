"""`rollout.slime_generate`: a slime custom generate function (only its imports changed) plays each
episode against SGLang's /generate on the endpoint; its Sample becomes one packed episode whose
model tokens are exactly the engine's, with the tool results it inserted out of the loss."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from transformers import AutoTokenizer

from endpoint_engines import RecordingEngine, ScriptedEngine
from longturn.engines.base import SamplingParams
from longturn.errors import SettingError
from longturn.params.config import ParamsError, parse_params
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.samples import samples_from_episodes
from longturn.serve.server import serve

SAMPLING = SamplingParams(max_new_tokens=48, temperature=1.0, top_p=1.0, top_k=0, seed=3)


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir: str):
    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


def _run(generate: str, timeout_s: float = 60.0) -> ConversationRun:
    """A run of `generate`, a function of tests/slime_generate_for_tests.py or a full path."""
    path = generate if ":" in generate else f"slime_generate_for_tests:{generate}"
    params = parse_params({"env": {"tasks": ["arithmetic_plain"]}, "rollout": {
        "protocol": "chat", "context": "episode", "slime_generate": path,
        "agent_timeout_s": timeout_s}})
    return ConversationRun.from_params(params, progress=False)


def _scripted(tokenizer, answers: dict[str, int]) -> RecordingEngine:
    """Two calculator calls (text after each </calc> that a stop cuts off), then the answer."""
    def reply(prompt: list[int]) -> str:
        text = tokenizer.decode(prompt)
        results = text.count("<result>")
        if results == 0:
            return "I compute. <calc>6*7</calc> and beyond"
        if results == 1:
            return "<calc>40+2</calc>"
        return f"ANSWER: {next(n for problem, n in answers.items() if problem in text)}"
    return RecordingEngine(ScriptedEngine(tokenizer, reply))


def _runs(mask: list[int], ids: list[int], bit: int) -> list[list[int]]:
    out: list[list[int]] = []
    for k, (m, t) in enumerate(zip(mask, ids)):
        if m == bit:
            if k == 0 or mask[k - 1] != bit:
                out.append([])
            out[-1].append(t)
    return out


def _play(tokenizer, generate: str, timeout_s: float = 60.0, wrong: int = 2):
    run = _run(generate, timeout_s)
    tasks = [run.record("arithmetic_plain", seed) for seed in (1, 2, 3)]
    answers = {t["messages"][-1]["content"]: int(t["answer"]) + (k == wrong)
               for k, t in enumerate(tasks)}
    engine = _scripted(tokenizer, answers)
    return tasks, engine, run.play(engine, tokenizer, SAMPLING, tasks, ["e0", "e1", "e2"])


def test_a_slime_tool_loop_packs_the_engines_tokens_in_and_its_tool_results_out(tokenizer):
    tasks, engine, records = _play(tokenizer, "generate")
    generated = engine.completions()
    assert len(generated) == 9  # three calls an episode
    assert max(len(prompts) for prompts, _, _ in engine.calls) == 3  # the episodes batched
    by_prompt = {tuple(p): c for p, c in generated}
    for k, (task, record) in enumerate(zip(tasks, records)):
        assert record["termination"] == "done" and not record["aborted"]
        assert record["reward"] == (0.0 if k == 2 else 1.0)  # the task's reward of the response
        [sample] = samples_from_episodes([record])
        ids = sample["prompt_ids"] + sample["response_ids"]
        mask = [0] * len(sample["prompt_ids"]) + sample["loss_mask"]
        model_runs, inserted = _runs(mask, ids, 1), _runs(mask, ids, 0)[1:]
        assert len(sample["replies"]) == len(model_runs) == 3
        # each reply the engine's call that ended it: cut at a stop string, or the end of turn
        assert [r["finish_reason"] for r in sample["replies"]] == ["stop"] * 3
        assert [tokenizer.decode(r) for r in inserted] == ["\n<result>42</result>\n"] * 2
        position = len(sample["prompt_ids"])
        for r, reply in zip(model_runs, sample["replies"]):
            # the reply is what the engine sampled for exactly the ids before it, cut at the stop
            completion = by_prompt[tuple(ids[:position + reply["start"]])]
            assert r == completion.token_ids[:len(r)]
            assert sample["engine_logprobs"][reply["start"]:reply["end"]] == \
                completion.logprobs[:len(r)]
        assert tokenizer.decode(model_runs[0]).endswith("<calc>6*7</calc>")
        assert model_runs[-1][-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert sample["replies"][-1]["reward"] == record["reward"]
        prompt = tokenizer.apply_chat_template(task["messages"], tokenize=False,
                                               add_generation_prompt=True)
        assert sample["prompt_ids"] == tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert json.loads(record["messages"])[-1]["content"] == (  # sample.response, as slime's
            "I compute. <calc>6*7</calc>\n<result>42</result>\n<calc>40+2</calc>\n"
            f"<result>42</result>\nANSWER: {int(task['answer']) + (k == 2)}<|im_end|>")


def test_the_shipped_example_nudges_calls_the_calculator_and_answers(tokenizer):
    """examples/slime_calculator_generate.py: a reply with neither a call nor an answer is told so
    (a user turn), a call stopped at </tool_call> gets its result (a tool turn), then the answer;
    the inserted turns are out of the loss, the reward is the task's."""
    run = _run("examples.slime_calculator_generate:generate")
    tasks = [run.record("arithmetic_plain", seed) for seed in (1, 2)]
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'

    def reply(prompt: list[int]) -> str:
        text = tokenizer.decode(prompt)
        if "<|im_start|>tool" in text:
            task = next(t for t in tasks if t["messages"][-1]["content"] in text)
            return f"ANSWER: {task['answer']}"
        return f"{call} and more" if "<|im_start|>user\nCall the" in text else "Hmm."
    engine = RecordingEngine(ScriptedEngine(tokenizer, reply))
    records = run.play(engine, tokenizer, SAMPLING, tasks, ["e0", "e1"])
    outputs = {tuple(c.token_ids) for _, c in engine.completions()}
    for record in records:
        assert record["termination"] == "done" and record["reward"] == 1.0
        # one inserted run is a user turn, one a tool result: nothing in a Sample tells them
        # apart, so the record counts neither (replies - 1 would say 2 calls)
        assert (record["tool_calls"], record["tool_errors"], record["user_turns"]) == (None,) * 3
        [sample] = samples_from_episodes([record])
        ids = sample["prompt_ids"] + sample["response_ids"]
        mask = [0] * len(sample["prompt_ids"]) + sample["loss_mask"]
        model_runs, inserted = _runs(mask, ids, 1), _runs(mask, ids, 0)[1:]
        assert tokenizer.decode(model_runs[1]).endswith("</tool_call>")  # cut at the stop
        assert all(tuple(r) in outputs for r in (model_runs[0], model_runs[2]))
        assert [tokenizer.decode(r) for r in inserted] == [
            "\n<|im_start|>user\nCall the calculator, or end with a line 'ANSWER: <number>'."
            "<|im_end|>\n<|im_start|>assistant\n",
            "<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"]


def test_append_response_tokens_and_a_reward_set_by_the_function(tokenizer):
    _, _, records = _play(tokenizer, "generate_with_append")
    for record in records:
        assert record["termination"] == "done" and record["reward"] == 0.25
        [sample] = samples_from_episodes([record])
        assert [r["reward"] for r in sample["replies"]] == [0.0, 0.0, 0.25]
        assert sum(1 for b in sample["loss_mask"] if not b) > 0


def test_a_generate_that_raises_or_hangs_aborts_its_episode(tokenizer):
    for name, reason, timeout_s in (("raises_after_a_call", "agent_error", 60.0),
                                    ("bad_request", "agent_error", 60.0),
                                    ("hangs", "timeout", 1.0)):
        _, _, records = _play(tokenizer, name, timeout_s)
        for record in records:
            assert record["aborted"] and record["termination"] == reason
            [sample] = samples_from_episodes([record])
            assert not any(sample["loss_mask"])  # its ending on one aborted reply, no token
            assert [(r["aborted"], r["termination"]) for r in sample["replies"]] == [
                (True, reason)]


def test_generate_refuses_bad_requests_and_records_nothing(tokenizer):
    engine = RecordingEngine(ScriptedEngine(tokenizer, lambda prompt: "hi"))

    async def send(port: int, body) -> tuple[int, dict]:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{port}/generate", json=body) as answer:
                return answer.status, await answer.json()

    with serve(engine, tokenizer, SAMPLING, max_prompt_tokens=100) as server:
        port = server.open_native("ep")
        for body, field in (({"sampling_params": {}}, "input_ids"),
                            ({"text": "a", "input_ids": [1]}, "input_ids"),
                            ({"input_ids": [1, -4]}, "input_ids"),
                            ({"input_ids": [1] * 101}, "input_ids"),
                            ({"text": 5}, "text"),
                            ({"text": "a", "sampling_params": {"max_new_tokens": 0}},
                             "sampling_params.max_new_tokens"),
                            ({"text": "a", "sampling_params": {"stop": 3}},
                             "sampling_params.stop"),
                            ([1, 2], None)):
            status, answer = asyncio.run(send(port, body))
            assert status == 400 and answer["error"]["param"] == field, (body, answer)
        assert server.calls("ep") == [] and engine.calls == []
        status, answer = asyncio.run(send(server.port, {"text": "a"}))  # the main port
        assert status == 404 and "no open episode" in answer["error"]["message"]
        status, answer = asyncio.run(send(port, {"text": "a", "return_logprob": True}))
        assert status == 200 and answer["meta_info"]["finish_reason"]["type"] == "stop"
        [call] = server.close_episode("ep")
        assert answer["output_ids"] == call.response_ids == engine.completions()[0][1].token_ids
        assert [p[0] for p in answer["meta_info"]["output_token_logprobs"]] == call.logprobs
        with pytest.raises(aiohttp.ClientConnectionError):  # its port is closed with it
            asyncio.run(send(port, {"text": "a"}))


def test_slime_generate_needs_whole_chat_episodes_and_an_async_function():
    with pytest.raises(ParamsError, match="rollout.context: episode"):
        parse_params({"rollout": {"protocol": "chat", "slime_generate": "m:g"}})
    with pytest.raises(ParamsError, match="name one"):
        parse_params({"rollout": {"protocol": "chat", "context": "episode",
                                  "slime_generate": "m:g", "agent": "m:a"}})
    with pytest.raises(SettingError, match="is not an async function"):
        _run("not_async")


def test_a_truncated_sample_ends_on_the_token_budget(tokenizer):
    _, engine, records = _play(tokenizer, "truncates")
    for record in records:
        assert record["termination"] == "token_budget" and record["truncated"]
        assert not record["aborted"]
        [sample] = samples_from_episodes([record])
        assert sample["loss_mask"] == [1, 1] and sample["replies"][0]["truncated"]
        assert sample["replies"][0]["finish_reason"] == "length"  # the call's reply cap
        assert sample["response_ids"] in [c.token_ids[:2] for _, c in engine.completions()]
