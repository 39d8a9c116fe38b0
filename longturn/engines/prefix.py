"""Prefill of one left-padded micro-batch, computing a shared token prefix only once.

Agent prompts of a batch start with the same system prompt and worked example (~300 of ~450
tokens), and on CPU the prefill dominates generation. So the common prefix is run once at batch
size 1, its KV cache repeated to the batch, and only the distinct suffixes are run batched.
Cache and mask afterwards: `[prefix][left pad of the suffixes][suffixes]`, mask 0 only on the
pads. Positions follow the mask, so every real token sits at the same position as in a plain
left-padded prefill and the logits match it up to kernel noise.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from longturn.engines.logprobs import positions_from_mask, repeated_prefix_cache
from longturn.engines.shared_prefix import shared_prefix_length


def left_pad(prompts: list[list[int]], pad_id: int, device: torch.device):
    """(input_ids, attention_mask) with every prompt ending in the last column."""
    width = max(len(p) for p in prompts)
    ids = [[pad_id] * (width - len(p)) + list(p) for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    as_tensor = lambda rows: torch.tensor(rows, dtype=torch.long, device=device)  # noqa: E731
    return as_tensor(ids), as_tensor(mask)


def prefill(
    model: torch.nn.Module, prompts: list[list[int]], pad_id: int, device: torch.device,
    share_prefix: bool = True,
) -> tuple[Cache, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every prompt left-padded into one batched forward; where the batch has a long enough
    common prefix, its first `cut` tokens run once first and the suffixes are batched on top.

    Returns what the decode loop starts from: the cache (every column of the mask), the raw
    logits [B, V] after each prompt's last token, the long attention mask [B, K] over the cached
    columns, and the position id [B] of each row's first new token."""
    cut = shared_prefix_length(prompts) if share_prefix else 0
    ids, mask = left_pad([p[cut:] for p in prompts], pad_id, device)
    cache = None
    if cut:
        prefix = torch.tensor([prompts[0][:cut]], dtype=torch.long, device=device)
        cache = repeated_prefix_cache(model, prefix, len(prompts), logits_to_keep=1)
        mask = torch.cat([mask.new_ones(len(prompts), cut), mask], dim=-1)
    positions = positions_from_mask(mask)[:, cut:]
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.past_key_values, out.logits[:, -1, :], mask, positions[:, -1] + 1
