"""The trainer's three models (actor, reference, critic) and the one way a batch runs through them.

Scoring (old and reference logprobs, values) and the PPO update both call these methods, so a
turn's old logprobs and the update's first logprobs come from the same computation. For model
families `decoder_stack` can split, a micro-batch first runs the trunk the three models share
(see `trunk.py`; nothing when they share none) and each output continues from it; other families
run each model whole.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from longturn.algo.critic import ValueModel, packed_response_values, packed_state_values
from longturn.engines.decoder_stack import decoder_of
from longturn.engines.prefix_memo import PrefixMemo
from longturn.algo.trunk import TrunkState, run_branch, run_trunk
from longturn.algo.trunk_rows import TrunkRows
from longturn.engines.logprobs import PackedBatch, response_logits, token_logprobs
from longturn.errors import UserError
from longturn.vision import feed
from longturn.vision.feed import RowImages

log = logging.getLogger(__name__)


def frozen_depth(decoder: nn.Module) -> int:
    """How many bottom layers (embedding included) hold no trainable parameter."""
    if any(p.requires_grad for p in decoder.embed_tokens.parameters()):
        return 0
    for index, layer in enumerate(decoder.layers):
        if any(p.requires_grad for p in layer.parameters()):
            return index
    return len(decoder.layers)


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def shared_trunk_depth(decoders: list[nn.Module]) -> int:
    """Layers the decoders can share: frozen in all of them and bitwise equal (embedding too)."""
    depth = min(frozen_depth(d) for d in decoders)
    if depth == 0:
        return 0
    first = decoders[0]
    for other in decoders[1:]:
        if other is first:
            continue
        parts = [(first.embed_tokens, other.embed_tokens)]
        parts += list(zip(first.layers[:depth], other.layers[:depth]))
        if not all(_same_weights(a, b) for a, b in parts):
            log.info("actor and critic differ below their trainable layers: no shared trunk")
            return 0
    return depth


def _lm_head(model: nn.Module) -> nn.Module:
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.get_output_embeddings()


def _response_columns(hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """Hidden states that predict each response token: columns P-1 .. P+R-2."""
    start, width = batch.prompt_width - 1, batch.response_ids.shape[1]
    return hidden[:, start : start + width]


LOGIT_ELEMENTS = 1 << 28  # float32 logits a chunk of rows may hold at once (1 GiB)


def _logprobs(features: torch.Tensor, head: nn.Module | None, batch: PackedBatch,
              temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(tempered, untempered) logprobs [B, R] from logits, or from hidden states and the LM head
    applied a chunk of rows at a time."""
    tokens, mask = batch.response_ids, batch.response_mask
    width, vocab = tokens.shape[1], (head.out_features if head is not None else features.shape[-1])
    rows = max(1, LOGIT_ELEMENTS // max(1, width * vocab))
    tempered, raw = [], []
    for start in range(0, tokens.shape[0], rows):
        part = features[start : start + rows]
        logits = (head(part) if head is not None else part).float()
        ids = tokens[start : start + rows]
        raw.append(token_logprobs(logits, ids))
        tempered.append(token_logprobs(logits / temperature, ids))
    return (torch.cat(tempered).masked_fill(~mask, 0.0), torch.cat(raw).masked_fill(~mask, 0.0))


class ModelSet:
    """Actor, reference (None: the actor with its LoRA adapters disabled) and critic (None: a
    critic-free estimator)."""

    def __init__(self, actor: nn.Module, ref: nn.Module | None, critic: ValueModel | None,
                 share_trunk: bool = True, gradient_checkpointing: bool = False,
                 vision: Any = None, keep_trunk_rows: bool = True) -> None:
        """`vision`: a vision-language model's frozen image side (`vision.encoder`), whose
        features every model's embedding takes at image placeholders (`vision.feed`).
        `keep_trunk_rows`: scoring keeps each row's trunk output for the update (off under
        ZeRO-3, where a rank skipping the trunk would skip its parameter gathers)."""
        if ref is None and not hasattr(actor, "disable_adapter"):
            raise ValueError("no reference model given and the actor has no adapters to disable")
        self.actor, self.ref, self.critic = actor, ref, critic
        self.vision = vision
        if vision is not None:
            for model in (actor, ref, critic):
                if model is not None:
                    feed.attach(model)
        self.checkpoint = gradient_checkpointing
        models = (actor, critic, ref if ref is not None else actor)
        parts = [decoder_of(m) for m in models if m is not None]
        self.split = all(p is not None for p in parts)
        if gradient_checkpointing and not self.split:
            raise UserError("ppo.gradient_checkpointing needs a llama / qwen2 / qwen3 model "
                            f"(this actor is {type(actor).__name__}); set it to false")
        self.actor_decoder, self.ref_decoder = parts[0], parts[-1]
        self.critic_decoder = parts[1] if critic is not None else None
        self.depth = shared_trunk_depth(parts) if share_trunk and self.split else 0
        self.trunk_prefixes = PrefixMemo()  # the frozen trunk's prefix passes: the whole run
        self.trunk_rows = TrunkRows() if keep_trunk_rows and vision is None else None
        self._branch_prefixes: PrefixMemo | None = None  # inside `scoring()` only

    @contextmanager
    def scoring(self) -> Iterator[None]:
        """A no-grad pass over many batches with fixed weights: each branch's prefix pass runs
        once and is reused, then forgotten (the next optimizer step changes the branches)."""
        self._branch_prefixes = PrefixMemo()
        try:
            yield
        finally:
            self._branch_prefixes = None

    def keeping_trunk_rows(self) -> AbstractContextManager:
        """A scoring call whose rows' trunk outputs the next update reads (`trunk_rows.py`)."""
        return nullcontext() if self.trunk_rows is None else self.trunk_rows.keeping()

    def forget_prefixes(self) -> None:
        """Drop every kept prefix pass and row (weights were loaded)."""
        self.trunk_prefixes.clear()
        if self.trunk_rows is not None:
            self.trunk_rows.clear()

    def images(self, batch: PackedBatch, images: Sequence[RowImages] | None
               ) -> AbstractContextManager:
        """The context in which forwards over `batch` see its rows' frames."""
        return feed.images_context(self.vision, batch.input_ids, batch.attention_mask, images)

    def trunk(self, batch: PackedBatch) -> TrunkState:
        """The shared trunk of this batch (empty when nothing is shared); no grad."""
        if not self.split:
            return TrunkState(0)
        return run_trunk(self.actor_decoder, batch, self.depth, self.trunk_prefixes,
                         self.trunk_rows)

    def actor_logits(self, batch: PackedBatch, trunk: TrunkState) -> torch.Tensor:
        """Raw logits [B, R, V] predicting each response token (grad follows grad mode)."""
        if not self.split:
            return response_logits(self.actor, batch)
        hidden = run_branch(self.actor_decoder, trunk, batch, self.checkpoint)
        return _lm_head(self.actor)(_response_columns(hidden, batch))

    def policy_logprobs(self, batch: PackedBatch, trunk: TrunkState, temperature: float,
                        reference: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Logprobs [B, R] of the response tokens under softmax(z / T), and untempered (what
        engines report), 0 at padding, without grad: scoring. The LM head runs a few rows at a
        time, so the float32 logits of the whole batch (V is 152k for Qwen) never exist at once."""
        model = self.actor if self.ref is None or not reference else self.ref
        adapters_off = reference and self.ref is None  # the reference: the actor without LoRA
        with torch.no_grad(), (self.actor.disable_adapter() if adapters_off else nullcontext()):
            if not self.split:
                return _logprobs(response_logits(model, batch), None, batch, temperature)
            decoder = self.ref_decoder if reference else self.actor_decoder
            hidden = run_branch(decoder, trunk, batch, memo=self._branch_prefixes,
                                role="reference" if reference else "actor")
            return _logprobs(_response_columns(hidden, batch), _lm_head(model), batch,
                             temperature)

    def _need_critic(self) -> ValueModel:
        if self.critic is None:
            raise ValueError("this model set has no critic (a critic-free estimator)")
        return self.critic

    def values(self, batch: PackedBatch, trunk: TrunkState) -> torch.Tensor:
        """Critic values [B, R] before each response token, 0 at padding."""
        self._need_critic()
        if not self.split:
            return packed_response_values(self.critic, batch)
        hidden = run_branch(self.critic_decoder, trunk, batch, self.checkpoint,
                            self._branch_prefixes, "critic")
        values = self.critic.head_values(_response_columns(hidden, batch))
        return values.masked_fill(~batch.response_mask, 0.0)

    def state_values(self, batch: PackedBatch, trunk: TrunkState) -> torch.Tensor:
        """V(state) [B] at each prompt's last token (batch packed with empty responses)."""
        self._need_critic()
        if not self.split:
            return packed_state_values(self.critic, batch)
        hidden = run_branch(self.critic_decoder, trunk, batch, memo=self._branch_prefixes,
                            role="critic")
        return self.critic.head_values(hidden[:, -1])
