"""Actor, reference and critic over one packed batch, their shared frozen trunk computed once.

With LoRA on the top N layers the three models share everything below: the embedding and the
bottom L − N layers are the base weights in all of them (the critic's too, since its warm-up
trained only its own top layers and head). `run_trunk` runs those once per micro-batch, without
grad (nothing in them trains), and `run_branch` continues from its output through one model's top
layers and final norm. With `depth` 0 there is no trunk and each branch runs its whole model
(full fine-tuning, where the critic's bottom differs from the actor's). The shared prompt prefix,
when the batch has one, is run at batch size 1 in every part: trunk layers once, each branch's
top layers once more, and the rows read it through a read-only cache. Scoring and the update
both go through these two functions (ModelSet); the update reads the trunk output of rows scoring
kept (`trunk_rows.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache

from longturn.engines.decoder_stack import (PassInputs, ReadOnlyPrefixCache, pass_inputs,
                                         prefix_inputs, run_layers)
from longturn.engines.prefix_memo import PrefixMemo
from longturn.algo.trunk_rows import TrunkRows
from longturn.engines.logprobs import PackedBatch


@dataclass
class TrunkState:
    """The shared part of one packed batch, up to layer `depth` (nothing when depth is 0)."""

    depth: int
    prefix_hidden: torch.Tensor | None = None  # [1, C, H] after the trunk (or embeddings)
    prefix_layers: list[Any] = field(default_factory=list)  # trunk layers' prefix K/V
    prefix: PassInputs | None = None
    hidden: torch.Tensor | None = None  # [B, T, H] of the non-prefix columns
    suffix: PassInputs | None = None


def run_trunk(decoder: nn.Module, batch: PackedBatch, depth: int,
              memo: PrefixMemo | None = None, rows: TrunkRows | None = None) -> TrunkState:
    """Embedding and layers[:depth] of `decoder` over the batch (and its shared prefix, whose
    pass `memo` keeps across batches: the trunk is frozen); the batch's own columns are
    assembled from `rows` where scoring kept every row's."""
    state = TrunkState(depth)
    if depth == 0:
        return state
    modules = [decoder.embed_tokens, *decoder.layers[:depth]]
    with torch.no_grad():
        cache = None
        if batch.prefix_ids is not None:
            def prefix_pass() -> tuple[torch.Tensor, PassInputs, list[Any]]:
                embeds = decoder.embed_tokens(batch.prefix_ids)
                inputs = prefix_inputs(decoder, embeds)
                recorded = DynamicCache()
                hidden = run_layers(decoder, 0, depth, embeds, inputs, recorded)
                return hidden, inputs, list(recorded.layers[:depth])

            parts = (prefix_pass() if memo is None
                     else memo.get("trunk", batch.prefix_ids, modules, prefix_pass))
            state.prefix_hidden, state.prefix, state.prefix_layers = parts
            cache = ReadOnlyPrefixCache(state.prefix_layers)
        embeds = decoder.embed_tokens(batch.input_ids)
        state.suffix = pass_inputs(decoder, embeds, batch.attention_mask, batch.position_ids, cache)

        def own_pass() -> torch.Tensor:
            return run_layers(decoder, 0, depth, embeds, state.suffix, cache)

        state.hidden = (own_pass() if rows is None
                        else rows.get(batch, modules, state.prefix_hidden, own_pass))
    return state


def run_branch(decoder: nn.Module, trunk: TrunkState, batch: PackedBatch,
               checkpoint: bool = False, memo: PrefixMemo | None = None,
               role: str = "actor") -> torch.Tensor:
    """Normed last hidden states [B, T, H] of one model, `decoder`'s layers[depth:] and norm,
    over the non-prefix columns; grad follows torch's grad mode (only this branch's layers can
    carry it). Without grad, `memo` keeps this branch's prefix pass for the next batch under
    `role` (the reference runs the actor's modules; the memo must not outlive the weights: see
    ModelSet)."""
    depth = trunk.depth
    cache, prefix_hidden, prefix = None, trunk.prefix_hidden, trunk.prefix
    if batch.prefix_ids is not None:
        if prefix_hidden is None:
            prefix_hidden = decoder.embed_tokens(batch.prefix_ids)
            prefix = prefix_inputs(decoder, prefix_hidden)

        def prefix_pass() -> list[Any]:
            recorded = DynamicCache()
            run_layers(decoder, depth, None, prefix_hidden, prefix, recorded)
            return list(recorded.layers[depth:])

        if memo is None or torch.is_grad_enabled():
            top = prefix_pass()
        else:
            modules = [*decoder.layers[depth:]] + ([decoder.embed_tokens] if depth == 0 else [])
            top = memo.get(role, batch.prefix_ids, modules, prefix_pass)
        cache = ReadOnlyPrefixCache(trunk.prefix_layers + top)
    hidden, suffix = trunk.hidden, trunk.suffix
    if hidden is None:
        hidden = decoder.embed_tokens(batch.input_ids)
        suffix = pass_inputs(decoder, hidden, batch.attention_mask, batch.position_ids, cache)
    hidden = run_layers(decoder, depth, None, hidden, suffix, cache, checkpoint)
    return decoder.norm(hidden)
