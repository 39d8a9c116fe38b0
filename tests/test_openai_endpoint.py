"""The OpenAI-compatible endpoint driven by the real `openai` client over the loopback: a
multi-call agent with tool calls, the record held against what the engine generated and what the
chat template renders, malformed requests (clear 4xx, nothing recorded) and unknown episodes."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from transformers import AutoTokenizer

from endpoint_engines import RecordingEngine, ScriptedEngine
from longturn.engines.base import SamplingParams
from longturn.rollout.chat_deltas import ChatDeltas
from longturn.serve.server import serve

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}
# spaced unlike the endpoint's own Hermes writing, so only the recorded text renders it back
CALL_TEXT = '<tool_call>{"name":"calculator","arguments":{"expression":"2+3"}}</tool_call>'
SAMPLING = SamplingParams(max_new_tokens=64, temperature=1.0, top_p=1.0, top_k=0, seed=7)


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir: str):
    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


def _rendered(tokenizer, messages: list[dict], tools: list[dict]) -> list[int]:
    """The chat protocol's rendering of a prompt (ChatDeltas.start on prepared messages)."""
    deltas = ChatDeltas(tokenizer, tools=tools)
    return deltas.start(deltas.prepare(messages))


def _scripted(tokenizer) -> RecordingEngine:
    """A tool call first, then the answer once a tool result is in the prompt."""
    tool_turn = tokenizer.encode("<|im_start|>tool", add_special_tokens=False)

    def reply(prompt: list[int]) -> str:
        has_result = any(prompt[i:i + len(tool_turn)] == tool_turn for i in range(len(prompt)))
        return "The answer is 5." if has_result else f"Let me compute.\n{CALL_TEXT}"
    return RecordingEngine(ScriptedEngine(tokenizer, reply))


def test_an_agent_with_a_tool_call_is_recorded_as_the_engine_generated_it(tokenizer):
    engine = _scripted(tokenizer)
    with serve(engine, tokenizer, SAMPLING, model_name="policy") as server:
        url = server.open_episode("ep-0")
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["policy"]
        messages = [{"role": "system", "content": "You add numbers."},
                    {"role": "user", "content": "What is 2+3?"}]
        first = client.chat.completions.create(model="policy", messages=messages,
                                               tools=[CALCULATOR], temperature=0.2)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        call = choice.message.tool_calls[0]
        assert (call.function.name, json.loads(call.function.arguments)) == (
            "calculator", {"expression": "2+3"})
        assert choice.message.content == "Let me compute."
        messages += [choice.message,  # as agents do: the client's own message object
                     {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        second = client.chat.completions.create(model="policy", messages=messages,
                                                tools=[CALCULATOR], max_completion_tokens=32)
        assert second.choices[0].message.content == "The answer is 5."
        assert second.choices[0].finish_reason == "stop"
        records = server.close_episode("ep-0")
        with pytest.raises(openai.NotFoundError):  # over: refused
            client.chat.completions.create(model="policy", messages=messages)

    generated = engine.completions()
    assert len(records) == len(generated) == 2
    for record, (prompt, completion) in zip(records, generated):
        assert record.prompt_ids == prompt
        assert record.response_ids == completion.token_ids
        assert record.logprobs == completion.logprobs
        assert record.finish_reason == completion.finish_reason == "stop"
    # the prompts are the template's rendering of what was sent, the tool call as the model
    # wrote it (its exact text, found by the call's id) and the tool result named by the call
    sent = [{"role": "system", "content": "You add numbers."},
            {"role": "user", "content": "What is 2+3?"}]
    assert records[0].prompt_ids == _rendered(tokenizer, sent, [CALCULATOR])
    sent += [{"role": "assistant", "content": f"Let me compute.\n{CALL_TEXT}"},
             {"role": "tool", "name": "calculator", "content": "5"}]
    assert records[1].prompt_ids == _rendered(tokenizer, sent, [CALCULATOR])
    assert records[1].rendered_messages[-2:] == sent[-2:]
    assert records[0].requested["temperature"] == 0.2  # asked for, not used: the run samples
    assert engine.calls[0][1].temperature == SAMPLING.temperature
    assert records[1].max_new_tokens == 32 and records[0].reply_finish_reason == "tool_calls"


def test_the_tiny_model_replies_are_recorded_as_sampled(tiny_model_dir, tokenizer):
    from longturn.engines.hf import HFEngine

    inner = HFEngine(tiny_model_dir, dtype="float32")
    engine = RecordingEngine(inner)
    with serve(engine, tokenizer, SAMPLING) as server:
        client = openai.OpenAI(base_url=server.open_episode("tiny"), api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "Say something."}]
        for _ in range(2):
            reply = client.chat.completions.create(model="any", messages=messages, max_tokens=6)
            assert reply.usage.completion_tokens <= 6
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": "Go on."}]
        records = server.close_episode("tiny")
    assert [(r.prompt_ids, r.response_ids, r.logprobs) for r in records] == [
        (p, c.token_ids, c.logprobs) for p, c in engine.completions()]
    assert all(len(r.response_ids) <= 6 for r in records)
    # the recorded ids are the engine's for that prompt and the call's own seed
    again = inner.generate([records[1].prompt_ids],
                           SamplingParams(6, 1.0, 1.0, 0, seed=(records[1].seed,)))[0]
    assert again.token_ids == records[1].response_ids
    assert records[1].prompt_ids == _rendered(tokenizer, records[1].rendered_messages, [])


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize("body, param", [
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
     "max_tokens"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}, "stream"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"x": 1}]},
     "tools[0]"),
    ({"model": "m", "messages": [{"role": "tool", "content": "5"}]}, "messages[0].tool_call_id"),
])
def test_a_malformed_request_is_a_400_naming_the_field_and_nothing_is_recorded(
        tokenizer, body, param):
    engine = _scripted(tokenizer)
    with serve(engine, tokenizer, SAMPLING) as server:
        url = server.open_episode("ep")
        status, answer = _post(f"{url}/chat/completions", json.dumps(body).encode())
        assert status == 400 and answer["error"]["param"] == param
        assert answer["error"]["type"] == "invalid_request_error"
        assert server.calls("ep") == []
    assert engine.calls == []


def test_the_client_raises_on_a_bad_request_and_on_bytes_that_are_not_json(tokenizer):
    engine = _scripted(tokenizer)
    with serve(engine, tokenizer, SAMPLING) as server:
        url = server.open_episode("ep")
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="n must be 1"):
            client.chat.completions.create(model="m", n=3,
                                           messages=[{"role": "user", "content": "hi"}])
        status, answer = _post(f"{url}/chat/completions", b"{not json")
        assert status == 400 and "not valid JSON" in answer["error"]["message"]
        assert server.close_episode("ep") == []
    assert engine.calls == []


def test_an_unknown_episode_or_path_is_a_404(tokenizer):
    engine = _scripted(tokenizer)
    with serve(engine, tokenizer, SAMPLING) as server:
        server.open_episode("known")
        client = openai.OpenAI(base_url=server.episode_url("unknown"), api_key="x",
                               max_retries=0)
        with pytest.raises(openai.NotFoundError, match="not open"):
            client.chat.completions.create(model="m",
                                           messages=[{"role": "user", "content": "hi"}])
        plain = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x",
                              max_retries=0)
        with pytest.raises(openai.NotFoundError, match="episode id"):
            plain.models.list()
        assert server.calls("known") == []
    assert engine.calls == []


class _FailsOnce:
    """An engine whose first call raises (a CUDA error, a dead SGLang server)."""

    def __init__(self, inner):
        self.inner, self.failed = inner, False

    def generate(self, prompt_ids, sampling):
        if not self.failed:
            self.failed = True
            raise RuntimeError("device lost")
        return self.inner.generate(prompt_ids, sampling)


def test_an_engine_failure_is_a_500_for_that_call_and_the_endpoint_goes_on(tokenizer):
    engine = _scripted(tokenizer)
    with serve(_FailsOnce(engine), tokenizer, SAMPLING) as server:
        client = openai.OpenAI(base_url=server.open_episode("ep"), api_key="x", max_retries=0)
        ask = [{"role": "user", "content": "What is 2+3?"}]
        with pytest.raises(openai.InternalServerError, match="device lost"):
            client.chat.completions.create(model="m", messages=ask)
        assert server.calls("ep") == []
        client.chat.completions.create(model="m", messages=ask)
        (record,) = server.close_episode("ep")
    assert (record.index, record.request_index) == (0, 1)
    assert record.response_ids == engine.completions()[0][1].token_ids


class _Held:
    """An engine that holds its call until released (an agent's episode ends meanwhile)."""

    def __init__(self, inner):
        self.inner, self.entered, self.release = inner, threading.Event(), threading.Event()

    def generate(self, prompt_ids, sampling):
        self.entered.set()
        assert self.release.wait(30)
        return self.inner.generate(prompt_ids, sampling)


def test_a_call_whose_episode_ends_while_it_runs_is_a_404_and_not_recorded(tokenizer):
    engine = _Held(_scripted(tokenizer))
    with serve(engine, tokenizer, SAMPLING) as server:
        client = openai.OpenAI(base_url=server.open_episode("ep"), api_key="x", max_retries=0)
        with ThreadPoolExecutor(1) as pool:
            late = pool.submit(client.chat.completions.create, model="m",
                               messages=[{"role": "user", "content": "hi"}])
            assert engine.entered.wait(30)
            assert server.close_episode("ep") == []  # the agent was given up on
            engine.release.set()
            with pytest.raises(openai.NotFoundError, match="ended while the call ran"):
                late.result()
