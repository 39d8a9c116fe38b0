"""Engines for the OpenAI endpoint's tests: one that says scripted replies, one that counts its
batches, one that keeps what a real engine returned. Each keeps every call, so a test can hold
the server's record against what the engine actually gave."""

from __future__ import annotations

import threading
from typing import Any, Callable

from longturn.engines.base import Completion, SamplingParams


class RecordingEngine:
    """Wraps an engine; keeps (prompts, sampling, completions) of each call."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.calls: list[tuple[list[list[int]], SamplingParams, list[Completion]]] = []
        self._lock = threading.Lock()

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        out = self.inner.generate(prompt_ids, sampling)
        with self._lock:
            self.calls.append(([list(p) for p in prompt_ids], sampling,
                               [Completion(list(c.token_ids), list(c.logprobs), c.finish_reason)
                                for c in out]))
        return out

    def completions(self) -> list[tuple[list[int], Completion]]:
        """Every (prompt, completion) the engine gave, in call order."""
        return [(p, c) for prompts, _, outs in self.calls for p, c in zip(prompts, outs)]

    def update_weights(self, model_dir: str) -> None: ...

    def close(self) -> None: ...


class ScriptedEngine:
    """Replies with `reply(prompt_ids)` as text, encoded, then the end-of-turn token; logprobs
    are made up but distinct per token; honours max_new_tokens like an engine."""

    def __init__(self, tokenizer: Any, reply: Callable[[list[int]], str]):
        self.tokenizer, self.reply = tokenizer, reply
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        out = []
        for prompt in prompt_ids:
            ids = self.tokenizer.encode(self.reply(prompt), add_special_tokens=False) + [self.end]
            cut = ids[:sampling.max_new_tokens]
            out.append(Completion(cut, [-0.01 * (k + 1) for k in range(len(cut))],
                                  "stop" if cut == ids else "length"))
        return out

    def update_weights(self, model_dir: str) -> None: ...

    def close(self) -> None: ...


class CountingEngine:
    """Answers every prompt with a fixed short reply and keeps each call's batch size."""

    def __init__(self, reply_ids: list[int]):
        self.reply_ids = reply_ids
        self.batch_sizes: list[int] = []

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        self.batch_sizes.append(len(prompt_ids))
        ids = self.reply_ids[:sampling.max_new_tokens]
        return [Completion(list(ids), [-0.5] * len(ids), "stop") for _ in prompt_ids]

    def update_weights(self, model_dir: str) -> None: ...

    def close(self) -> None: ...
