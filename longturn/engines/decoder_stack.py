"""A Hugging Face decoder-only model run piece by piece: embed → layers[a:b] → final norm.

Why: under top-layer LoRA, actor, reference and critic share their frozen bottom layers, so a
forward that can stop after layer k and go on from there runs that trunk once (`algo/trunk.py`); and
gradient checkpointing needs a layer that can be re-run with the same inputs, which the usual
growing KV cache does not allow when a shared prompt prefix sits in it.

The pieces are the model's own modules (embedding, rotary embedding, the masks of transformers'
masking utilities, decoder layers, final norm), called as the model's forward calls them, so a
run of every layer equals the whole-model forward (`tests/test_trunk.py` compares them). Model
families whose forward differs from that pattern are not split: `decoder_of` returns None and
callers run the whole model.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as checkpoint_call
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask

# Families whose model forward is exactly embed → causal mask → rotary → layers → norm.
SPLITTABLE_MODEL_TYPES = ("llama", "qwen2", "qwen3")


def decoder_of(module: nn.Module) -> nn.Module | None:
    """The base decoder (embed_tokens, layers, norm, rotary_emb) inside a causal LM, a peft
    wrapper or a ValueModel; None for a family that cannot be split this way."""
    inner = module
    if hasattr(inner, "backbone"):  # ValueModel
        inner = inner.backbone
    if hasattr(inner, "get_base_model"):  # peft
        inner = inner.get_base_model()
    if hasattr(inner, "model") and not hasattr(inner, "layers"):  # *ForCausalLM
        inner = inner.model
    config = getattr(inner, "config", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if config is None or not all(hasattr(inner, name) for name in needed):
        return None
    if getattr(config, "model_type", None) not in SPLITTABLE_MODEL_TYPES:
        return None
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        return None
    return inner


class ReadOnlyPrefixCache(DynamicCache):
    """The K/V a shared prompt prefix left in each layer (batch 1), read by every row and never
    extended: `update` returns prefix ⊕ new keys without storing them, so re-running a layer
    (gradient checkpointing) sees exactly what the first run saw. Gradients reach the prefix
    through `expand`, summed over the rows."""

    def __init__(self, layers: list[Any]) -> None:
        super().__init__()
        self.layers = list(layers)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.layers[layer_idx]
        rows = key_states.shape[0]
        keys = torch.cat([layer.keys.expand(rows, -1, -1, -1), key_states], dim=-2)
        values = torch.cat([layer.values.expand(rows, -1, -1, -1), value_states], dim=-2)
        return keys, values


@dataclass
class PassInputs:
    """What every layer of one forward pass shares."""

    mask: Any  # whatever the attention implementation takes (None: plain causal)
    position_embeddings: tuple[torch.Tensor, torch.Tensor]
    position_ids: torch.Tensor


def pass_inputs(decoder: nn.Module, embeds: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor, cache: DynamicCache | None) -> PassInputs:
    """The causal mask (padding and any cached prefix included) and rotary embeddings."""
    mask = create_causal_mask(config=decoder.config, inputs_embeds=embeds,
                              attention_mask=attention_mask, past_key_values=cache,
                              position_ids=position_ids)
    rotary = decoder.rotary_emb(embeds, position_ids=position_ids)
    return PassInputs(mask, rotary, position_ids)


def run_layers(decoder: nn.Module, start: int, stop: int | None, hidden: torch.Tensor,
               inputs: PassInputs, cache: DynamicCache | None,
               checkpoint: bool = False) -> torch.Tensor:
    """Decoder layers [start, stop) on `hidden` (stop None: to the last). With `checkpoint` (and
    grad on) each layer keeps only its input and recomputes the rest in backward; its cache must
    then be read-only. A recording DynamicCache collects each layer's K/V (a prefix pass)."""
    recompute = checkpoint and torch.is_grad_enabled()
    if recompute and cache is not None and not isinstance(cache, ReadOnlyPrefixCache):
        raise ValueError("gradient checkpointing needs a read-only prefix cache")
    for layer in decoder.layers[start:stop]:
        call = partial(layer, attention_mask=inputs.mask, position_ids=inputs.position_ids,
                       past_key_values=cache, use_cache=cache is not None,
                       position_embeddings=inputs.position_embeddings)
        hidden = checkpoint_call(call, hidden, use_reentrant=False) if recompute else call(hidden)
    return hidden


def prefix_inputs(decoder: nn.Module, embeds: torch.Tensor) -> PassInputs:
    """Inputs of a prefix pass: batch 1, no padding, positions 0..C-1."""
    positions = torch.arange(embeds.shape[1], device=embeds.device)[None]
    return pass_inputs(decoder, embeds, None, positions, DynamicCache())
