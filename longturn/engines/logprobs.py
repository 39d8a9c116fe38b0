"""Per-token logprobs of responses under a causal LM, in one layout shared by engine and trainer.

The engine's behaviour logprobs, the trainer's old/ref logprobs and the training loss all use this
one layout, so the numbers agree up to kernel noise (~1e-6 in float32).

Layout ("middle aligned"): prompts are LEFT-padded so they all end at the same column P, responses
start at P and are RIGHT-padded. Position ids follow the attention mask
(`(mask.cumsum(-1) - 1).clamp(min=0)`), so padding on either side changes nothing for the real
tokens, and only the logits of columns P-1 .. P+R-2 are projected onto the vocabulary.

Shared prefix (optional): the tokens every prompt starts with (system prompt + worked example) are
run once at batch size 1 and their KV cache is repeated to the batch; only the prompt tails and
responses are run batched. Gradients flow through the repeated cache into the prefix pass, so the
same layout serves training, where it cuts the tokens per turn by more than half.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from longturn.engines.shared_prefix import shared_prefix_length


@dataclass
class PackedBatch:
    """Token tensors for a batch of (prompt, response) pairs in the middle-aligned layout.

    With a shared prefix of C tokens, input_ids and position_ids cover only what follows it
    (prompt tails + responses) while attention_mask also covers the C prefix columns.
    """

    input_ids: torch.Tensor  # [B, P + R] long
    attention_mask: torch.Tensor  # [B, C + P + R] long
    position_ids: torch.Tensor  # [B, P + R] long
    response_ids: torch.Tensor  # [B, R] long, pad_id where masked
    response_mask: torch.Tensor  # [B, R] bool
    prompt_width: int  # P (of the prompt tails when a prefix is shared)
    prefix_ids: torch.Tensor | None = None  # [1, C] long: the shared prefix, run once


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that ignore padding: 0 at each sequence's first real token."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def pack_prompt_response(
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    pad_id: int = 0,
    device: str | torch.device = "cpu",
    share_prefix: bool = False,
) -> PackedBatch:
    """Left-pad prompts to a common end column, right-pad responses after it; with
    ``share_prefix`` the prompts' common prefix is split off to be run once."""
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token")
    cut = shared_prefix_length(prompt_ids) if share_prefix else 0
    tails = [list(p[cut:]) for p in prompt_ids]
    width_p = max(len(p) for p in tails)
    width_r = max((len(r) for r in response_ids), default=0)
    rows, masks = [], []
    for prompt, response in zip(tails, response_ids):
        left, right = width_p - len(prompt), width_r - len(response)
        rows.append([pad_id] * left + prompt + list(response) + [pad_id] * right)
        masks.append([0] * left + [1] * (len(prompt) + len(response)) + [0] * right)
    input_ids = torch.tensor(rows, dtype=torch.long, device=device)
    mask = torch.tensor(masks, dtype=torch.long, device=device)
    full_mask = torch.cat([mask.new_ones(len(rows), cut), mask], dim=-1)
    prefix = torch.tensor([prompt_ids[0][:cut]], dtype=torch.long, device=device) if cut else None
    return PackedBatch(
        input_ids=input_ids,
        attention_mask=full_mask,
        position_ids=positions_from_mask(full_mask)[:, cut:],
        response_ids=input_ids[:, width_p:],
        response_mask=mask[:, width_p:].bool(),
        prompt_width=width_p,
        prefix_ids=prefix,
    )


def repeated_prefix_cache(model: torch.nn.Module, prefix_ids: torch.Tensor, batch_size: int,
                          **kwargs: Any) -> DynamicCache:
    """Run a [1, C] prefix once and repeat its KV cache to ``batch_size`` rows (real copies, so
    rows can be dropped later; differentiable when grad is on)."""
    cut = prefix_ids.shape[1]
    cache = DynamicCache()
    model(input_ids=prefix_ids, position_ids=torch.arange(cut, device=prefix_ids.device)[None],
          past_key_values=cache, use_cache=True, **kwargs)
    cache.batch_repeat_interleave(batch_size)
    return cache


def forward_packed(model: torch.nn.Module, batch: PackedBatch, **kwargs: Any) -> Any:
    """``model(...)`` over the batch's non-prefix columns (the shared prefix, if any, first runs
    once into a KV cache that is repeated to the batch). ``logits_to_keep`` applies to the batch
    pass; the prefix pass keeps one logit. Grad follows torch's grad mode through both passes."""
    if batch.prefix_ids is None:
        return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                     position_ids=batch.position_ids, use_cache=False, **kwargs)
    prefix_kwargs = {"logits_to_keep": 1} if "logits_to_keep" in kwargs else {}
    cache = repeated_prefix_cache(model, batch.prefix_ids, batch.input_ids.shape[0],
                                  **prefix_kwargs)
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                 position_ids=batch.position_ids, past_key_values=cache, use_cache=True, **kwargs)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[token] in float32, without materialising the full log-softmax."""
    logits = logits.float()
    picked = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def response_logits(model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    """Raw logits [B, R, V] predicting each response token (grad follows torch's grad mode)."""
    width_r = batch.response_ids.shape[1]
    return forward_packed(model, batch, logits_to_keep=width_r + 1).logits[:, :-1, :]
