"""slime's names for a slime generate function run here: `Sample` (with `Sample.Status`), `post` and
`GenerateState`, so a file written for slime runs after changing only its import lines, from
`slime.rollout.sglang_rollout`, `slime.utils.http_utils` and `slime.utils.types` to:

    from longturn.serve.slime_api import GenerateState, Sample, post

Why our own copies rather than slime's: slime imports torch, Ray and Megatron at module level;
these are the few names a generate function touches, with slime's field names and meanings
(docs/openai-endpoint.md lists them). slime's multimodal, top-p replay, routed-expert and
speculative-decoding fields are kept as plain fields, not read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import aiohttp


@dataclass
class Sample:
    """One prompt's rollout, as slime's `slime.utils.types.Sample`."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)  # prompt + response ids
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0  # the response's ids: the last this many of `tokens`
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None  # over the response: 1 sampled, 0 inserted
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None  # over the response, as the engine gave them
    rollout_top_p_token_ids: Any = None
    rollout_top_p_token_offsets: Any = None
    rollout_routed_experts: Any = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    def get_reward_value(self, args: Any) -> float:
        key = getattr(args, "reward_key", None)
        return self.reward if not key else self.reward[key]  # type: ignore[index,return-value]

    @property
    def effective_response_length(self) -> int:
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def append_response_tokens(self, args: Any = None, *, tokens: Any = None,
                               log_probs: Any = None, trainable: bool = True,
                               meta_info: dict | None = None, text: str | None = None,
                               update_terminal_info: bool = True) -> None:
        """Append response ids with their loss mask and logprobs, as slime's method does
        (`meta_info` is not read: the finish reason is the caller's to turn into a status)."""
        tokens = [int(t) for t in (tokens or [])]
        log_probs = None if log_probs is None else [float(v) for v in log_probs]
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(f"log_probs length {len(log_probs)} != tokens length {len(tokens)}")
        if tokens and trainable and log_probs is None:
            raise ValueError("trainable response tokens require rollout log probabilities.")
        if tokens and not trainable:
            if log_probs is not None:
                raise ValueError("non-trainable response tokens should not pass rollout log "
                                 "probabilities.")
            log_probs = [0.0] * len(tokens)
        if text is not None:
            self.response += text
        before = self.response_length
        if tokens:
            self.tokens += tokens
            self.response_length += len(tokens)
            if self.loss_mask is None:
                self.loss_mask = [1] * before
            self.loss_mask += [1 if trainable else 0] * len(tokens)
        if log_probs is not None:
            if self.rollout_log_probs is None:
                if trainable and before:
                    raise ValueError("Cannot append trainable rollout log probabilities to a "
                                     "sample with existing response tokens but no existing "
                                     "rollout_log_probs.")
                self.rollout_log_probs = [0.0] * before
            self.rollout_log_probs += log_probs


class HTTPError(RuntimeError):
    """The endpoint refused a call (its status and message)."""


async def post(url: str, payload: dict[str, Any], max_retries: int = 60,
               headers: dict[str, str] | None = None) -> Any:
    """POST JSON, return the JSON answer (slime's `post`). No retries: the endpoint is local,
    and a refused call is the caller's error, raised with the endpoint's message."""
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=payload, headers=headers) as response:
            body = await response.json(content_type=None)
            if response.status != 200:
                message = body.get("error", {}).get("message") if isinstance(body, dict) else body
                raise HTTPError(f"POST {url}: {response.status}: {message}")
            return body


class GenerateState:
    """What slime's `GenerateState(args)` gives a generate function: the tokenizer and the
    default sampling params. The adapter hands the run's tokenizer over in `args`; without it,
    the tokenizer of `args.hf_checkpoint` is loaded."""

    def __init__(self, args: Any):
        self.args = args
        self.tokenizer = getattr(args, "tokenizer", None)
        if self.tokenizer is None:
            from transformers import AutoTokenizer
            self.tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
        self.processor = None
        self.sampling_params: dict[str, Any] = dict(getattr(args, "sampling_params", None) or {})
