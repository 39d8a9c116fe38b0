"""The engine protocol: token ids in, token ids + raw-policy logprobs out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SamplingParams:
    """Explicit sampling settings; RL sampling uses top_k=0 and top_p=1.0 (no truncation)."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None


@dataclass
class Completion:
    """One sampled response: exact token ids, the untempered policy's logprob of each, why it stopped."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (end-of-turn token sampled) or "length" (max_new_tokens reached)


class Engine(Protocol):
    """A generation backend (in-process transformers, or an SGLang server over HTTP)."""

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        """(An engine serving a vision-language model also takes `images=`: per prompt, the
        (placeholder start, frame) pairs; `HFEngine.generate`.)"""

    def update_weights(self, model_dir: str) -> None: ...

    def close(self) -> None: ...
