"""Many agents calling the endpoint at once are few engine calls: the batcher sends a batch when
every open episode has a call waiting, at `max_batch`, or when the window has passed. Counted with
an engine that keeps its batch sizes; no wall-time asserts (the windows are long, so a batch
goes out only because it is full)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from transformers import AutoTokenizer

from endpoint_engines import CountingEngine
from longturn.engines.base import SamplingParams
from longturn.serve.batcher import Batcher
from longturn.serve.openai_request import RequestError
from longturn.serve.server import serve

SAMPLING = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=1.0, top_k=0, seed=3)


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir: str):
    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


def _agent(url: str, calls: int) -> list[str]:
    """An agent of `calls` chat calls, each after the previous reply."""
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": f"Hello from {url.rsplit('/', 2)[-2]}"}]
    replies = []
    for _ in range(calls):
        reply = client.chat.completions.create(model="m", messages=messages)
        replies.append(reply.choices[0].message.content)
        messages += [{"role": "assistant", "content": replies[-1]},
                     {"role": "user", "content": "more"}]
    return replies


def _play(server, agents: int, calls: int) -> dict[str, list]:
    urls = {f"ep{i}": server.open_episode(f"ep{i}") for i in range(agents)}
    with ThreadPoolExecutor(max_workers=agents) as pool:
        done = {ep: pool.submit(_agent, url, calls) for ep, url in urls.items()}
        replies = {ep: future.result() for ep, future in done.items()}
    return {ep: server.close_episode(ep) for ep in urls} | {"replies": replies}


def test_64_agents_calling_at_once_are_one_engine_call_per_round(tokenizer):
    engine = CountingEngine(tokenizer.encode("ok<|im_end|>", add_special_tokens=False))
    with serve(engine, tokenizer, SAMPLING, max_batch=64, window_s=30.0) as server:
        played = _play(server, agents=64, calls=3)
    assert engine.batch_sizes == [64, 64, 64]  # 192 requests, 3 engine calls
    assert all(len(played[f"ep{i}"]) == 3 for i in range(64))
    assert all(r == ["ok"] * 3 for r in played["replies"].values())
    seeds = {rec.seed for i in range(64) for rec in played[f"ep{i}"]}
    assert len(seeds) == 192  # each call samples from its own stream


def test_a_batch_is_capped_at_max_batch(tokenizer):
    engine = CountingEngine(tokenizer.encode("ok<|im_end|>", add_special_tokens=False))
    with serve(engine, tokenizer, SAMPLING, max_batch=16, window_s=30.0) as server:
        _play(server, agents=64, calls=1)
    assert engine.batch_sizes == [16, 16, 16, 16]


def test_an_agent_away_holds_the_others_only_for_the_window(tokenizer):
    engine = CountingEngine(tokenizer.encode("ok<|im_end|>", add_special_tokens=False))
    with serve(engine, tokenizer, SAMPLING, max_batch=64, window_s=0.05) as server:
        server.open_episode("idle")  # open, never calls (an agent running a slow tool)
        played = _play(server, agents=1, calls=2)
    assert engine.batch_sizes == [1, 1] and len(played["ep0"]) == 2


def test_a_reply_is_cut_to_the_calls_own_cap_in_a_shared_batch(tokenizer):
    engine = CountingEngine(tokenizer.encode("one two three four five<|im_end|>",
                                             add_special_tokens=False))
    with serve(engine, tokenizer, SAMPLING, max_batch=2, window_s=30.0) as server:
        urls = [server.open_episode(ep) for ep in ("short", "long")]
        clients = [openai.OpenAI(base_url=u, api_key="x", max_retries=0) for u in urls]
        with ThreadPoolExecutor(2) as pool:
            short, long = [f.result() for f in [pool.submit(
                c.chat.completions.create, model="m", max_tokens=cap,
                messages=[{"role": "user", "content": "count"}])
                for c, cap in zip(clients, (2, 16))]]
        records = [server.close_episode(ep) for ep in ("short", "long")]
    assert engine.batch_sizes == [2]
    assert (short.usage.completion_tokens, short.choices[0].finish_reason) == (2, "length")
    assert long.choices[0].finish_reason == "stop"
    assert records[0][0].response_ids == records[1][0].response_ids[:2]


def test_a_batch_past_its_window_waits_for_a_call_still_being_rendered():
    engine = CountingEngine([1, 2])

    async def main() -> None:
        batcher = Batcher(engine, SAMPLING, max_batch=8, window_s=0.0, open_episodes=lambda: 3)
        running = asyncio.create_task(batcher.run())
        rendered = asyncio.Event()

        async def slow_call():
            with batcher.arriving():
                await rendered.wait()
            return await batcher.generate([5], 4, None)

        slow = asyncio.create_task(slow_call())
        await asyncio.sleep(0)
        fast = asyncio.create_task(batcher.generate([6], 4, None))
        for _ in range(5):  # let the loop spin well past the window
            await asyncio.sleep(0.01)
        assert engine.batch_sizes == []  # held for the call being rendered
        rendered.set()
        await asyncio.gather(slow, fast)
        running.cancel()
        batcher.close()

    asyncio.run(main())
    assert engine.batch_sizes == [2]


def test_a_call_that_arrived_during_a_batch_waits_for_that_batchs_agents_to_call_again():
    release = threading.Event()

    class Held(CountingEngine):
        def generate(self, prompt_ids, sampling):
            assert release.wait(30)
            return super().generate(prompt_ids, sampling)

    engine = Held([1, 2])

    async def main() -> None:
        batcher = Batcher(engine, SAMPLING, max_batch=8, window_s=0.05, open_episodes=lambda: 3)
        running = asyncio.create_task(batcher.run())

        async def agent(calls: int) -> None:
            for _ in range(calls):
                await batcher.generate([7], 4, None)

        a, b = asyncio.create_task(agent(2)), asyncio.create_task(agent(2))
        while not batcher.batch_sizes:  # the batch of a and b is with the engine
            await asyncio.sleep(0.01)
        c = asyncio.create_task(agent(1))  # arrives while it runs ...
        await asyncio.sleep(0.2)  # ... and its window passes
        release.set()
        await asyncio.gather(a, b, c)
        running.cancel()
        batcher.close()

    asyncio.run(main())
    assert engine.batch_sizes == [2, 3]  # c went out with a's and b's next calls, not alone


class HeldEngine(CountingEngine):
    """Holds its batch until `released()` says so (the endpoint has answered its calls)."""

    def __init__(self, reply_ids: list[int]):
        super().__init__(reply_ids)
        self.entered = threading.Event()
        self.released = lambda: False  # the test says when

    def generate(self, prompt_ids, sampling):
        self.entered.set()
        deadline = time.monotonic() + 60  # a failed test must not hang the suite here
        while not self.released() and time.monotonic() < deadline:
            time.sleep(0.01)
        return super().generate(prompt_ids, sampling)


def test_a_call_inside_the_engine_when_the_endpoint_stops_is_refused_with_a_503(tokenizer):
    engine = HeldEngine(tokenizer.encode("ok<|im_end|>", add_special_tokens=False))

    async def stop_while_the_engine_runs() -> RequestError:
        batcher = Batcher(engine, SAMPLING, max_batch=1, window_s=0.0, open_episodes=lambda: 1)
        running = asyncio.create_task(batcher.run())
        call = asyncio.create_task(batcher.answer("ep", 0, [1, 2, 3], 4, "a call"))
        await asyncio.to_thread(engine.entered.wait, 60)
        engine.released = lambda: all(w.future.done() for w in batcher._running)
        running.cancel()  # as the server stops: the batcher first, then close
        with contextlib.suppress(asyncio.CancelledError):
            await running
        batcher.close()  # fails the running call, then waits for the engine
        with pytest.raises(RequestError) as refused:
            await call
        return refused.value

    refused = asyncio.run(stop_while_the_engine_runs())
    assert (refused.status, refused.body()["error"]["type"]) == (503, "server_error")
    assert "shutting down" in str(refused) and engine.batch_sizes == [1]
