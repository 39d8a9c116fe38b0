"""One optimizer step of the actor / critic engine on a mini-batch, plus the update's statistics.

Gradient accumulation: each micro loss is divided by the MINI-batch's token count (``normalizer``)
and handed to DeepSpeed with ``scale_wrt_gas=False`` (else DeepSpeed divides it by
gradient_accumulation_steps again), so the summed gradient is exactly that of the mini-batch token
mean, whatever the number or sizes of its micro-batches. The boundary is set by hand on the last
micro-batch, so a smaller last mini-batch still ends in exactly one optimizer step.

With several ranks the normalizer is the mini-batch's token count over ALL ranks divided by the
world size: DeepSpeed averages gradients over ranks, so this is the token mean of the global
mini-batch, not a mean of per-rank means.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist

from longturn.algo.batches import TurnBatch, autocast, pad_rows
from longturn.algo.model_set import ModelSet
from longturn.algo.ppo import (entropy_from_logits, explained_variance, masked_mean, policy_loss,
                               think_action_masks, value_loss)
from longturn.distributed import sum_over_ranks
from longturn.engines.logprobs import pack_prompt_response, token_logprobs
from longturn.profiling import MICRO_BATCH, mark
from longturn.vision.feed import has_images

def schedule(n: int, mini_batch_size: int, micro_batch_size: int, rng: np.random.Generator,
             lengths: Sequence[int] | None = None) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
    """Shuffled mini-batches (near-equal, each <= mini_batch_size) and their micro-batches.

    With `lengths` (tokens per row) a mini-batch is cut into micro-batches in length order:
    the optimizer step sums the same rows' gradients, but rows of like length share a padded
    micro-batch, so far fewer padding columns run forward and backward."""
    perm = rng.permutation(n)
    for mini in np.array_split(perm, math.ceil(n / mini_batch_size)):
        rows = mini if lengths is None else mini[np.argsort([lengths[i] for i in mini],
                                                            kind="stable")]
        yield mini, np.array_split(rows, math.ceil(len(mini) / micro_batch_size))


class UpdateStats:
    """Token-weighted means of per-token stats and plain means of per-step scalars.

    Values may be device tensors: they are summed where they are and read once, in `summary`,
    so collecting statistics does not make the host wait for the GPU every micro-batch."""

    def __init__(self) -> None:
        self.weighted: dict[str, list[Any]] = defaultdict(lambda: [0.0, 0.0])
        self.steps: dict[str, list[Any]] = defaultdict(list)

    def add_tokens(self, n_tokens: int, **values: torch.Tensor | float) -> None:
        for key, value in values.items():
            acc = self.weighted[key]
            acc[0] = acc[0] + _detached(value) * n_tokens
            acc[1] += n_tokens

    def add_step(self, **values: torch.Tensor | float) -> None:
        for key, value in values.items():
            self.steps[key].append(_detached(value))

    def merge(self, other: "UpdateStats") -> None:
        """Add another collection's values (e.g. one epoch's) to this one."""
        for key, (total, count) in other.weighted.items():
            acc = self.weighted[key]
            acc[0], acc[1] = acc[0] + total, acc[1] + count
        for key, values in other.steps.items():
            self.steps[key].extend(values)

    def summary(self) -> dict[str, float]:
        out = {k: float(total) / max(count, 1e-12) for k, (total, count) in self.weighted.items()}
        out.update({k: float(np.mean([float(x) for x in v])) for k, v in self.steps.items()})
        return out


def _detached(value: torch.Tensor | float) -> torch.Tensor | float:
    return value.detach() if isinstance(value, torch.Tensor) else float(value)


def _take_step(engine: Any) -> float:
    """Optimizer step; returns the pre-clip gradient norm (after the cross-rank reduction)."""
    norm = None
    if engine.zero_optimization_stage() == 0:  # grads are whole and already all-reduced here
        grads = [p.grad.detach().float().norm() for p in engine.parameters() if p.grad is not None]
        norm = float(torch.stack(grads).norm()) if grads else 0.0
    engine.step()
    if norm is None:
        norm = engine.get_global_grad_norm()
    return float("nan") if norm is None else float(norm)


def _normalizers(batch: TurnBatch, mini: np.ndarray, s: Any) -> tuple[float, float]:
    """Token counts of the whole mini-batch over all ranks: actor (tokens), critic (tokens with
    position 0 weighted `first_token_weight`)."""
    tokens = float(batch.n_tokens(mini))
    valid_rows = int(sum(not batch.aborted[i] for i in mini))
    weighted = tokens + (s.first_token_weight - 1.0) * valid_rows
    pair = sum_over_ranks(np.array([tokens, weighted])) / (dist.get_world_size()
                                                          if dist.is_initialized() else 1)
    return max(float(pair[0]), 1.0), max(float(pair[1]), 1e-8)


def minibatch_step(models: ModelSet, actor: Any, critic: Any, batch: TurnBatch,
                   mini: np.ndarray, micros: list[np.ndarray], s: Any, pad_id: int,
                   stats: UpdateStats, train_actor: bool = True) -> None:
    """One optimizer step per DeepSpeed engine over one mini-batch (`actor` and `critic` are
    the engines of the ModelSet's modules; `critic` None: a critic-free estimator).

    Per micro-batch the shared trunk runs once; the actor branch then runs forward and backward
    (clipped surrogate minus the entropy bonus), then the critic branch (clipped value loss,
    position 0 weighted more), so only one branch's activations are alive at a time."""
    actor_norm, critic_norm = _normalizers(batch, mini, s)
    device = next(actor.parameters()).device
    actor_total = critic_total = 0.0
    for j, idx in enumerate(micros):
        with mark(MICRO_BATCH):  # a trace counts launches and syncs per micro-batch
            mb = batch.select(idx).to(device)
            last = j == len(micros) - 1
            packed = pack_prompt_response(mb.prompt_ids, mb.response_ids, pad_id, device,
                                          s.share_prefix and not has_images(mb.images))
            with models.images(packed, mb.images):
                with autocast(s.bf16, device):
                    trunk = models.trunk(packed)
                if train_actor:
                    actor.set_gradient_accumulation_boundary(last)
                    actor_total += _actor_backward(models, actor, trunk, packed, mb, s,
                                                   actor_norm, stats)
                if critic is None:
                    continue
                critic.set_gradient_accumulation_boundary(last)
                with autocast(s.bf16, device):
                    values = models.values(packed, trunk)
            loss, st = value_loss(values.float(), mb.values, mb.returns, mb.mask, s.value_clip,
                                  s.first_token_weight, critic_norm)
            critic.backward(loss, scale_wrt_gas=False)
            critic_total = critic_total + loss.detach()
            stats.add_tokens(mb.n_tokens, value_clip_fraction=st["value_clip_fraction"])
    if train_actor:
        stats.add_step(policy_loss=actor_total, grad_norm_actor=_take_step(actor))
    if critic is not None:
        stats.add_step(value_loss=critic_total, grad_norm_critic=_take_step(critic))


def _actor_backward(models: ModelSet, engine: Any, trunk: Any, packed: Any, mb: Any, s: Any,
                    normalizer: float, stats: UpdateStats) -> torch.Tensor:
    """Forward and backward of the actor branch on one micro-batch; returns its loss."""
    with autocast(s.bf16, packed.input_ids.device):
        logits = models.actor_logits(packed, trunk).float() / s.temperature
    logprobs = token_logprobs(logits, packed.response_ids).masked_fill(~packed.response_mask, 0.0)
    loss, st = policy_loss(logprobs, mb.old_logprobs, mb.advantages, mb.mask, s.clip_ratio,
                           normalizer)
    total = loss.detach()
    if s.entropy_coef:
        entropy = entropy_from_logits(logits, mb.mask)
        loss = loss - s.entropy_coef * entropy * (mb.n_tokens / normalizer)
    else:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach(), mb.mask)
    engine.backward(loss, scale_wrt_gas=False)
    stats.add_tokens(mb.n_tokens, clip_fraction=st["clip_fraction"], approx_kl=st["approx_kl"],
                     entropy=entropy.detach())
    return total


def split_kl(kl: torch.Tensor, valid: torch.Tensor, think: torch.Tensor,
             action: torch.Tensor) -> dict[str, float]:
    """KL over THINK and over ACTION tokens; NaN for both when no reply has an ACTION tag (chat
    replies, or a model that never wrote one): there is no split to compare, a 0 would read as no
    drift, and NaN is left out of the logged curves."""
    if not bool((valid & action).any()):
        return {"kl_think": float("nan"), "kl_action": float("nan")}
    return {"kl_think": float(masked_mean(kl, valid & think)),
            "kl_action": float(masked_mean(kl, valid & action))}


def batch_stats(batch: TurnBatch, tokenizer: Any) -> dict[str, float]:
    """Statistics of the batch as scored (before the update): KL old‖ref (and by THINK / ACTION
    part where replies have one), explained variance of the stored values and the returns'
    variance that decides whether it is meaningful (algo/value_fit.py), raw advantage / value /
    return means."""
    old, ref = pad_rows(batch.columns["old_logprobs"]), pad_rows(batch.columns["ref_logprobs"])
    valid = pad_rows([batch.loss_tokens(i) for i in range(len(batch))], old.shape[1], torch.bool)
    think, action = think_action_masks(batch.response_ids, tokenizer, width=old.shape[1])
    kl = old - ref  # k1
    returns = batch.flat("returns")
    out = {
        "kl_mean": float(masked_mean(kl, valid)),
        **split_kl(kl, valid, think, action),
        "advantage_mean": float(batch.flat("advantages").mean()),
        "return_mean": float(returns.mean()),
        "n_turns": float(len(batch)),
        "n_tokens": float(valid.sum()),
    }
    if batch.has_values:  # a critic-free batch has none
        values = batch.flat("values")
        ones = torch.ones(len(values), dtype=torch.bool)
        out.update(explained_variance=float(explained_variance(
            torch.from_numpy(values), torch.from_numpy(returns), ones)),
            return_variance=float(returns.astype(np.float64).var()),  # EV's denominator
            value_mean=float(values.mean()))
    return out
