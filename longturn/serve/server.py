"""The engine served as an OpenAI-compatible endpoint on the loopback, for agents that speak the
OpenAI chat API (docs/openai-endpoint.md).

Why a thread of its own: the rollout that plays agents is synchronous code (like the rest of the
run), while many agents call at once; the server runs its own event loop in a background thread,
so the caller opens episodes, hands each agent its URL and reads the record without any asyncio
of its own.

    with serve(engine, tokenizer, sampling) as server:
        url = server.open_episode("ep-0")    # http://127.0.0.1:PORT/episodes/ep-0/v1
        ...                                   # the agent calls OpenAI(base_url=url, api_key="x")
        calls = server.close_episode("ep-0")  # [CallRecord]: prompt ids, response ids, logprobs
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any, Callable, Iterator

from aiohttp import web

from longturn.engines.base import Engine, SamplingParams
from longturn.serve.batcher import Batcher
from longturn.serve.call_quota import CallQuota
from longturn.serve.native_generate import NativeGenerate
from longturn.serve.openai_request import RequestError
from longturn.serve.recording import CallRecord, EpisodeBook
from longturn.serve.rendering import PromptRenderer
from longturn.serve.routes import ChatEndpoint

START_TIMEOUT_S = 30.0


class OpenAIServer:
    """One served model, any number of episodes; start/stop it or use it as a context manager."""

    def __init__(self, engine: Engine, tokenizer: Any, sampling: SamplingParams, *,
                 model_name: str = "longturn-policy", max_batch: int = 64,
                 window_s: float = 0.02, max_prompt_tokens: int | None = None,
                 template_kwargs: dict[str, Any] | None = None, host: str = "127.0.0.1"):
        """`sampling`: the run's sampling (temperature, top_p, top_k, the reply cap and the seed
        every call's seed is derived from); `max_batch` / `window_s`: how calls are gathered
        into engine batches (serve/batcher.py); `max_prompt_tokens`: longer prompts are refused
        (400) before they reach the engine."""
        if isinstance(sampling.seed, tuple):
            raise ValueError("the endpoint derives each call's seed from one run seed (an int "
                             "or None), not a tuple of per-prompt seeds")
        self.engine, self.sampling, self.model_name = engine, sampling, model_name
        self.max_batch, self.window_s, self.host = max_batch, window_s, host
        self.max_prompt_tokens = max_prompt_tokens
        self.book = EpisodeBook()
        self.quota = CallQuota()  # loop-side: read and set through `allow` and `quotas`
        self.renderer = PromptRenderer(tokenizer, template_kwargs)
        self.port: int | None = None
        self.tokenizer = tokenizer
        self._episode_of_port: dict[int, str] = {}  # a native episode's own port (open_native)
        self._native_sites: dict[str, tuple[web.BaseSite, int]] = {}  # episode → (site, port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> OpenAIServer:
        if self._loop is not None:
            raise RuntimeError("the endpoint is already running")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="openai-endpoint")
        self._thread.start()
        try:
            self._call(self._start(), START_TIMEOUT_S)
        except BaseException:
            self._end_loop()
            raise
        return self

    async def _start(self) -> None:
        self.batcher = Batcher(self.engine, self.sampling, max_batch=self.max_batch,
                               window_s=self.window_s, open_episodes=self._calling)
        self._endpoint = ChatEndpoint(self.book, self.renderer, self.batcher, self.sampling,
                                      self.model_name, self.max_prompt_tokens, self.quota)
        self._batching = asyncio.create_task(self.batcher.run())
        native = NativeGenerate(self.book, self.tokenizer, self.batcher, self.sampling,
                                self.max_prompt_tokens, self._episode_of_port)
        app = self._endpoint.app()
        app.router.add_post("/generate", native.generate)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, 0).start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        """Unanswered calls get 503; the engine's running batch is waited for."""
        if self._loop is None:
            return
        try:
            self._call(self._stop(), None)
        finally:
            self._end_loop()

    def _calling(self) -> int:
        """Open episodes that may call now (the batcher waits for these)."""
        return self.book.open_count() - self.quota.spent()

    async def _stop(self) -> None:
        self.quota.drop_all(RequestError("the endpoint is shutting down", status=503,
                                         kind="server_error"))
        self._batching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._batching
        self.batcher.close()
        await self._runner.cleanup()
        self._endpoint.close()

    def _call(self, coroutine: Any, timeout: float | None) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def _end_loop(self) -> None:
        assert self._loop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ episodes

    def episode_url(self, episode_id: str) -> str:
        """The base URL an agent of this episode is given (an OpenAI client's `base_url`)."""
        if self.port is None:
            raise RuntimeError("the endpoint is not running")
        return f"http://{self.host}:{self.port}/episodes/{episode_id}/v1"

    def open_episode(self, episode_id: str) -> str:
        """Open an episode for calls; its base URL. Open episodes count as agents the batcher
        waits for, so close each one as soon as its agent returns."""
        self.book.open(episode_id)
        return self.episode_url(episode_id)

    def open_native(self, episode_id: str) -> int:
        """Open an episode served on a port of its own, for SGLang's native `POST /generate`
        (serve/native_generate.py: slime's generate functions name an address, not a path);
        that port. `close_episode` closes the port too."""
        self.book.open(episode_id)
        try:
            return self._call(self._listen(episode_id), START_TIMEOUT_S)
        except BaseException:
            self.book.close(episode_id)
            raise

    async def _listen(self, episode_id: str) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((self.host, 0))  # the port known before it listens, from the socket itself
        port = sock.getsockname()[1]
        site = web.SockSite(self._runner, sock)
        await site.start()
        self._native_sites[episode_id] = site, port
        self._episode_of_port[port] = episode_id
        return port

    async def _unlisten(self, episode_id: str) -> None:
        site, port = self._native_sites.pop(episode_id)
        del self._episode_of_port[port]
        await site.stop()

    def close_episode(self, episode_id: str) -> list[CallRecord]:
        """The episode's calls in answer order; its later calls get 404 (and its own port, if
        it has one, closes)."""
        calls = self.book.close(episode_id)
        self._on_loop(self.quota.drop, episode_id, RequestError(
            f"episode {episode_id!r} is over", "episode", 404, "not_found_error"))
        if episode_id in self._native_sites:
            self._call(self._unlisten(episode_id), START_TIMEOUT_S)
        return calls

    def allow(self, quotas: dict[str, int]) -> None:
        """Give these episodes so many more calls each (serve/call_quota.py: beyond them a
        call is held unanswered), all at once."""
        self._on_loop(self.quota.allow, quotas)

    def quotas(self) -> dict[str, tuple[int, list[int] | None]]:
        """Episode → (calls it may still make, the prompt ids of its held call or None)."""
        return self._on_loop(self.quota.state)

    def _on_loop(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` run on the server's loop, where the quota lives (no lock)."""
        async def run() -> Any:
            return function(*args)
        return self._call(run(), START_TIMEOUT_S)

    def calls(self, episode_id: str) -> list[CallRecord]:
        """The calls answered so far of an open episode."""
        return self.book.calls(episode_id)


@contextlib.contextmanager
def serve(engine: Engine, tokenizer: Any, sampling: SamplingParams, **options: Any
          ) -> Iterator[OpenAIServer]:
    """The endpoint, running for the `with` block (options: `OpenAIServer`'s)."""
    with OpenAIServer(engine, tokenizer, sampling, **options) as server:
        yield server
