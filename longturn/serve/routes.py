"""The HTTP side of the endpoint: `/episodes/<id>/v1/models` and `…/v1/chat/completions`.

One call: the episode must be open (404), the request is checked and rendered (4xx naming the
field; nothing recorded), a call past its episode's quota is held (serve/call_quota.py), its
prompt goes to the batcher with the call's own seed, the reply is read for tool calls, recorded,
and answered in the OpenAI shape. Every error, routing ones included, is an OpenAI error object,
so any OpenAI client raises its usual exception.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable, Callable

from aiohttp import web

from longturn.engines.base import SamplingParams
from longturn.serve.batcher import Batcher
from longturn.serve.call_quota import CallQuota
from longturn.serve.openai_reply import reply_message
from longturn.serve.openai_request import ChatRequest, RequestError, parse_request
from longturn.serve.recording import CallRecord, EpisodeBook, EpisodeNotOpen
from longturn.serve.rendering import PromptRenderer

PREFIX = "/episodes/{episode}/v1"
MAX_BODY_BYTES = 64 * 2**20  # a long agent context in JSON, with room


@web.middleware
async def json_errors(request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
    """Refused calls (every route's `RequestError`) and routing errors (unknown path, wrong
    method, body too large) as OpenAI error objects with their status."""
    try:
        return await handler(request)
    except RequestError as err:
        return web.json_response(err.body(), status=err.status)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        hint = (f"; calls go to {PREFIX.replace('{episode}', '<episode id>')}/chat/completions"
                if err.status == 404 else "")
        kind = "not_found_error" if err.status == 404 else "invalid_request_error"
        refused = RequestError(f"{err.reason}: {request.method} {request.path}{hint}",
                               status=err.status, kind=kind)
        return web.json_response(refused.body(), status=refused.status)


async def read_json(request: web.Request) -> Any:
    """The request's body as JSON; a body that is not JSON is refused."""
    try:
        return await request.json()
    except ValueError:
        raise RequestError("the request body is not valid JSON") from None


class ChatEndpoint:
    """The handlers and what they share; lives on the server's event loop."""

    def __init__(self, book: EpisodeBook, renderer: PromptRenderer, batcher: Batcher,
                 sampling: SamplingParams, model_name: str, max_prompt_tokens: int | None,
                 quota: CallQuota):
        self.book, self.renderer, self.batcher, self.quota = book, renderer, batcher, quota
        self.sampling, self.model_name = sampling, model_name
        self.max_prompt_tokens = max_prompt_tokens
        self._render_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="render")

    def app(self) -> web.Application:
        app = web.Application(middlewares=[json_errors], client_max_size=MAX_BODY_BYTES)
        app.router.add_get(f"{PREFIX}/models", self.models)
        app.router.add_post(f"{PREFIX}/chat/completions", self.chat_completions)
        return app

    def close(self) -> None:
        self._render_thread.shutdown(wait=True)

    def _episode(self, request: web.Request) -> str:
        episode = request.match_info["episode"]
        if not self.book.is_open(episode):
            raise RequestError(f"episode {episode!r} is not open (never opened, or over)",
                               "episode", status=404, kind="not_found_error")
        return episode

    async def models(self, request: web.Request) -> web.Response:
        self._episode(request)
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "longturn"}]})

    def _prepare(self, body: Any, episode: str) -> tuple[ChatRequest, list[dict], list[int]]:
        """Check and render (on the render thread: the template and tokenizer are CPU work
        that must not stall the loop while other calls arrive)."""
        parsed = parse_request(body, self.sampling.max_new_tokens, self.book.replies(episode))
        try:
            rendered, prompt_ids = self.renderer.render(parsed.messages, parsed.tools)
        except Exception as err:  # the template refused these messages (a jinja exception)
            raise RequestError(f"the chat template cannot render these messages: "
                               f"{type(err).__name__}: {err}", "messages") from None
        if self.max_prompt_tokens is not None and len(prompt_ids) > self.max_prompt_tokens:
            raise RequestError(f"the messages render to {len(prompt_ids)} tokens; this endpoint "
                               f"takes at most {self.max_prompt_tokens}", "messages")
        return parsed, rendered, prompt_ids

    async def chat_completions(self, request: web.Request) -> web.Response:
        episode = self._episode(request)
        try:
            with self.batcher.arriving():  # a batch waits for a call still being read
                body = await read_json(request)
                parsed, rendered, prompt_ids = await asyncio.get_running_loop().run_in_executor(
                    self._render_thread, self._prepare, body, episode)
            await self.quota.admit(episode, prompt_ids)  # past the episode's quota: held here
            index = self.book.accept(episode)  # no await from here to the batcher's queue
        except EpisodeNotOpen:  # closed while it was checked
            raise RequestError(f"episode {episode!r} is over", "episode", 404,
                               "not_found_error") from None
        completion, seed = await self.batcher.answer(
            episode, index, prompt_ids, parsed.max_new_tokens, "a chat completion")
        text = self.renderer.reply_text(completion.token_ids)
        message, finish = reply_message(text, completion.finish_reason, parsed.read_tool_calls,
                                        index)
        record = self.book.record(episode, CallRecord(
            index=-1, request_index=index, messages=body["messages"], rendered_messages=rendered,
            tools=parsed.tools, prompt_ids=list(prompt_ids),
            response_ids=list(completion.token_ids), logprobs=list(completion.logprobs),
            finish_reason=completion.finish_reason, reply_text=text, reply=message,
            reply_finish_reason=finish, seed=seed, max_new_tokens=parsed.max_new_tokens,
            requested=parsed.requested), [c["id"] for c in message.get("tool_calls", [])])
        if record is None:
            raise RequestError(f"episode {episode!r} ended while the call ran", "episode", 404,
                               "not_found_error")
        return web.json_response({
            "id": f"chatcmpl-{episode}-{index}", "object": "chat.completion",
            "created": int(time.time()), "model": self.model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": None}],
            "usage": {"prompt_tokens": len(prompt_ids),
                      "completion_tokens": len(completion.token_ids),
                      "total_tokens": len(prompt_ids) + len(completion.token_ids)}})
