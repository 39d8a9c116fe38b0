"""The engine protocol: token ids in, token ids + raw-policy logprobs out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from longturn.params.config import SamplingSection


@dataclass(frozen=True)
class SamplingParams:
    """Explicit sampling settings; RL sampling uses top_k=0 and top_p=1.0 (no truncation).

    No defaults of its own: `from_config` reads engine.sampling, the one place defaults live; a
    caller that samples otherwise (a bench's greedy pass) passes every field."""

    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | tuple[int, ...] | None  # the call's seed, or one per prompt (None: random)

    @classmethod
    def from_config(cls, section: SamplingSection, seed: int | None,
                    temperature: float | None = None) -> SamplingParams:
        """engine.sampling with a seed, and a temperature override (eval.temperature) if given."""
        return cls(max_new_tokens=section.max_new_tokens,
                   temperature=section.temperature if temperature is None else temperature,
                   top_p=section.top_p, top_k=section.top_k, seed=seed)


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


def engine_image_token(engine: Engine) -> tuple[int, int] | None:
    """The engine's image placeholder (id, tokens per image); None for a text-only model."""
    vision = getattr(engine, "vision", None)
    return None if vision is None else vision.placeholder


def generate_with_frames(engine: Engine, prompt_ids: list[list[int]],
                         frames: list[list[tuple[int, Any]]],
                         sampling: SamplingParams) -> list[Completion]:
    """One batched generation, each prompt with its (placeholder start, frame) pairs; they are
    passed only when a prompt has one, so engines without image support keep their plain
    signature. What both protocols call."""
    if not any(frames):
        return engine.generate(prompt_ids, sampling)
    return engine.generate(prompt_ids, sampling, images=frames)  # type: ignore[call-arg]
