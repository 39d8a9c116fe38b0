"""SGLang's native `POST /generate` on the endpoint, for slime-style generate functions (the
fields honoured and the answer's shape: docs/openai-endpoint.md, "The engine it calls").

Why a port per episode: slime's generate functions build their URL from an address alone
(`http://{args.sglang_router_ip}:{args.sglang_router_port}/generate`), with no room for an episode
id in the path. So each episode that plays this way gets a listening port of its own
(`OpenAIServer.open_native`), and the port a request arrived on names its episode. A request on
the main port, or on a port whose episode is over, gets 404.

Temperature, top_p and top_k are the run's (the policy samples as it trains); whatever was asked
is recorded. A stop is applied by cutting the sampled reply where the stop first shows: the
tokens before it are the ones a sampler stopping there would give. The call is recorded in its
episode like a chat call and batched with every other call.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from longturn.engines.base import Completion, SamplingParams
from longturn.serve.batcher import Batcher
from longturn.serve.openai_request import RequestError
from longturn.serve.recording import CallRecord, EpisodeBook, EpisodeNotOpen
from longturn.serve.routes import read_json


def _int_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise RequestError(f"{where} must be a list of token ids (integers)", where)
    return value


def _stops(params: dict[str, Any]) -> list[str]:
    stop = params.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s]
    raise RequestError("sampling_params.stop must be a string or a list of strings",
                       "sampling_params.stop")


class NativeGenerate:
    """The `/generate` handler; lives on the server's event loop."""

    def __init__(self, book: EpisodeBook, tokenizer: Any, batcher: Batcher,
                 sampling: SamplingParams, max_prompt_tokens: int | None,
                 episode_of_port: dict[int, str]):
        self.book, self.tokenizer, self.batcher = book, tokenizer, batcher
        self.sampling, self.max_prompt_tokens = sampling, max_prompt_tokens
        self.episode_of_port = episode_of_port  # written by the server as ports open and close

    def _episode(self, request: web.Request) -> str:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        episode = self.episode_of_port.get(sockname[1]) if sockname else None
        if episode is None or not self.book.is_open(episode):
            raise RequestError("no open episode listens on this port: /generate is served on "
                               "the port of each episode's address", status=404,
                               kind="not_found_error")
        return episode

    def _parse(self, body: Any) -> tuple[list[int], dict[str, Any], int, list[str], set[int]]:
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        if ("input_ids" in body) == ("text" in body):
            raise RequestError("give exactly one of input_ids or text", "input_ids")
        if body.get("stream"):
            raise RequestError("stream is not supported: ask for the whole answer", "stream")
        if "input_ids" in body:
            ids = _int_list(body["input_ids"], "input_ids")
            vocab = len(self.tokenizer)
            if any(not 0 <= t < vocab for t in ids):
                raise RequestError(f"input_ids holds ids outside the vocabulary (0..{vocab - 1})",
                                   "input_ids")
        else:
            if not isinstance(body["text"], str):
                raise RequestError("text must be a string", "text")
            ids = list(self.tokenizer.encode(body["text"]))
        if not ids:
            raise RequestError("the prompt is empty", "input_ids")
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            raise RequestError(f"the prompt has {len(ids)} tokens; this endpoint takes at most "
                               f"{self.max_prompt_tokens}", "input_ids")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise RequestError("sampling_params must be an object", "sampling_params")
        cap = params.get("max_new_tokens", self.sampling.max_new_tokens)
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise RequestError("sampling_params.max_new_tokens must be an integer >= 1",
                               "sampling_params.max_new_tokens")
        stop_ids = set(_int_list(params.get("stop_token_ids") or [],
                                 "sampling_params.stop_token_ids"))
        return ids, params, min(cap, self.sampling.max_new_tokens), _stops(params), stop_ids

    def _stopped(self, completion: Completion, stops: list[str], stop_ids: set[int]
                 ) -> tuple[Completion, Any]:
        """The reply cut at its first stop token id or stop string (kept, as no_stop_trim)."""
        ids = completion.token_ids
        end, matched = len(ids), None
        for k, token in enumerate(ids):
            if token in stop_ids:
                end, matched = k + 1, token
                break
        if stops and any(s in self.tokenizer.decode(ids[:end]) for s in stops):
            for k in range(1, end + 1):
                text = self.tokenizer.decode(ids[:k])
                hit = next((s for s in stops if s in text), None)
                if hit is not None:
                    end, matched = k, hit
                    break
        if matched is None:
            return completion, None
        return Completion(list(ids[:end]), list(completion.logprobs[:end]), "stop"), matched

    async def generate(self, request: web.Request) -> web.Response:
        episode = self._episode(request)
        with self.batcher.arriving():
            body = await read_json(request)
            ids, params, cap, stops, stop_ids = self._parse(body)
        try:
            index = self.book.accept(episode)  # no await from here to the batcher's queue
        except EpisodeNotOpen:
            raise RequestError("this port's episode is over", status=404,
                               kind="not_found_error") from None
        completion, seed = await self.batcher.answer(episode, index, ids, cap, "a /generate call")
        completion, matched = self._stopped(completion, stops, stop_ids)
        skip = params.get("skip_special_tokens", True)
        text = await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.tokenizer.decode(completion.token_ids,
                                                skip_special_tokens=bool(skip)))
        finish = {"type": completion.finish_reason, "matched": matched}
        if completion.finish_reason == "length":
            finish = {"type": "length", "length": len(completion.token_ids)}
        record = self.book.record(episode, CallRecord(
            index=-1, request_index=index, messages=[], rendered_messages=[], tools=[],
            prompt_ids=list(ids), response_ids=list(completion.token_ids),
            logprobs=list(completion.logprobs), finish_reason=completion.finish_reason,
            reply_text=text, reply={"role": "assistant", "content": text},
            reply_finish_reason=completion.finish_reason, seed=seed, max_new_tokens=cap,
            requested=dict(params)), [])
        if record is None:
            raise RequestError("the episode ended while the call ran", status=404,
                               kind="not_found_error")
        meta: dict[str, Any] = {
            "id": f"generate-{episode}-{index}", "finish_reason": finish,
            "prompt_tokens": len(ids), "completion_tokens": len(completion.token_ids)}
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in
                                             zip(completion.logprobs, completion.token_ids)]
        return web.json_response({"text": text, "output_ids": list(completion.token_ids),
                                  "meta_info": meta})
