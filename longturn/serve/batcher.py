"""Concurrent chat calls gathered into engine batches.

Why: 64 agents each calling the endpoint would otherwise be 64 engine calls of one prompt each,
and the GPU would idle between them. A batch is sent when every open episode has a request
waiting (all agents are blocked on the model: waiting longer gains nothing), when `max_batch`
requests wait, or `window_s` after its first request arrived or the last batch was answered,
whichever is later, once no call is still being checked and rendered (why those two last rules:
docs/openai-endpoint.md, "Batching"). While the engine runs a batch, new requests queue for the
next one. The engine is called from one worker thread, never two calls at once.

Each request keeps its own seed and reply cap: the batch is sampled with the largest cap and each
reply is cut back to its own (a row's tokens do not depend on the cap, so the cut reply is the
one a call with that cap samples), with finish reason `length` when cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator

from longturn.engines.base import Completion, Engine, SamplingParams
from longturn.engines.row_seeds import keyed_seed
from longturn.serve.openai_request import RequestError

log = logging.getLogger(__name__)

# How long past its window a batch waits at most for calls still being read and rendered (a
# client that never finishes sending its body must not hold every agent up)
RENDER_WAIT_S = 2.0


@dataclass
class _Waiting:
    prompt_ids: list[int]
    max_new_tokens: int
    seed: int | None
    arrived: float
    future: asyncio.Future


def cut(completion: Completion, limit: int) -> Completion:
    """The completion as a call capped at `limit` tokens would have it."""
    if len(completion.token_ids) <= limit:
        return completion
    return Completion(list(completion.token_ids[:limit]), list(completion.logprobs[:limit]),
                      "length")


class Batcher:
    """Runs on the server's event loop: `generate` queues one prompt, `run` sends the batches."""

    def __init__(self, engine: Engine, sampling: SamplingParams, *, max_batch: int,
                 window_s: float, open_episodes: Callable[[], int]):
        if max_batch < 1 or window_s < 0:
            raise ValueError(f"max_batch {max_batch} (>= 1), window_s {window_s} (>= 0)")
        self.engine, self.sampling = engine, sampling
        self.max_batch, self.window_s, self.open_episodes = max_batch, window_s, open_episodes
        self.batch_sizes: list[int] = []  # one entry per engine call, for metrics and tests
        self._waiting: list[_Waiting] = []
        self._running: list[_Waiting] = []  # the batch the engine has now
        self._preparing = 0  # calls arrived but not yet queued (being checked and rendered)
        self._answered_at = float("-inf")  # when the last batch's calls were answered
        self._arrived = asyncio.Event()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """Around checking and rendering a call: a batch past its window waits for it. Call
        `generate` right after the block (no await in between), so it is never counted out
        before it is queued."""
        self._preparing += 1
        try:
            yield
        finally:
            self._preparing -= 1
            self._arrived.set()

    async def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int | None
                       ) -> Completion:
        loop = asyncio.get_running_loop()
        waiting = _Waiting(prompt_ids, max_new_tokens, seed, loop.time(), loop.create_future())
        self._waiting.append(waiting)
        self._arrived.set()
        return await waiting.future

    async def answer(self, episode: str, index: int, prompt_ids: list[int], max_new_tokens: int,
                     what: str) -> tuple[Completion, int | None]:
        """A recorded call's completion and seed: the seed follows from the run's seed, the
        episode and the call's arrival number, so a call samples the same whichever calls share
        its batch. A stopping endpoint or a failing engine is the RequestError the route
        answers (503, 500)."""
        seed = (keyed_seed(self.sampling.seed, f"{episode}/{index}")
                if isinstance(self.sampling.seed, int) else None)
        try:
            return await self.generate(prompt_ids, max_new_tokens, seed), seed
        except RequestError:  # the endpoint stopped before the call was answered (`close`)
            raise
        except Exception as err:
            log.exception("the engine failed on %s of episode %s", what, episode)
            raise RequestError(f"the engine failed: {type(err).__name__}: {err}", status=500,
                               kind="server_error") from err

    def _full(self) -> bool:
        return len(self._waiting) >= min(self.max_batch, max(1, self.open_episodes()))

    async def _gather(self) -> list[_Waiting]:
        """Wait for the first request, then until the batch is full or its window has passed."""
        loop = asyncio.get_running_loop()
        while not self._waiting:
            self._arrived.clear()
            await self._arrived.wait()
        deadline = max(self._waiting[0].arrived, self._answered_at) + self.window_s
        while not self._full():
            left = deadline - loop.time()
            if left <= 0 and (not self._preparing or left <= -RENDER_WAIT_S):
                break
            self._arrived.clear()
            try:  # past the window, each arrival or finished rendering looks again
                await asyncio.wait_for(self._arrived.wait(),
                                       left if left > 0 else left + RENDER_WAIT_S)
            except TimeoutError:
                pass
        batch, self._waiting = self._waiting[:self.max_batch], self._waiting[self.max_batch:]
        return [w for w in batch if not w.future.done()]  # a caller that left is not sampled

    def _sample(self, batch: list[_Waiting]) -> list[Completion]:
        seeds = [w.seed for w in batch]
        sampling = dataclasses.replace(
            self.sampling, max_new_tokens=max(w.max_new_tokens for w in batch),
            seed=None if None in seeds else tuple(seeds))
        completions = self.engine.generate([w.prompt_ids for w in batch], sampling)
        return [cut(c, w.max_new_tokens) for c, w in zip(completions, batch, strict=True)]

    async def run(self) -> None:
        """Send batches until cancelled; an engine error fails that batch's calls only."""
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            if not batch:
                continue
            self.batch_sizes.append(len(batch))
            self._running = batch
            try:
                completions = await loop.run_in_executor(self._worker, self._sample, batch)
            except Exception as err:  # the callers answer 500; the server goes on
                for w in batch:
                    if not w.future.done():
                        w.future.set_exception(err)
                continue
            for w, completion in zip(batch, completions):
                if not w.future.done():
                    w.future.set_result(completion)
            self._answered_at = loop.time()

    def close(self) -> None:
        """Fail every unanswered call (after `run` was cancelled), then wait for the engine."""
        for w in self._waiting + self._running:
            if not w.future.done():
                w.future.set_exception(RequestError("the endpoint is shutting down", status=503,
                                                    kind="server_error"))
        self._waiting = []
        self._worker.shutdown(wait=True)
