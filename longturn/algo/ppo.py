"""PPO losses and KL terms: pure functions on padded [B, R] tensors with token-level masks.

Aggregation is token-mean over every valid token of the mini-batch (long responses weigh in per
token, not per sequence). When a mini-batch is split into gradient-accumulation micro-batches, pass
the mini-batch's total (weighted) token count as ``normalizer`` so the micro-batch losses sum to
the mini-batch token mean. Stats are detached 0-d tensors (``.item()`` them when logging, so the
device is not synchronised per micro-batch).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from longturn.algo.value_fit import explained_variance_meaningful
from longturn.reply_format import parse_reply

KLEstimator = Literal["k1", "k2", "k3"]
_LOG_RATIO_CLAMP = 20.0  # |log ratio| cap where an exp() is taken: exp(20) is still finite in bf16
Stats = dict[str, torch.Tensor]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over mask != 0 (0 where nothing is selected); masked entries may be nan/inf."""
    m = mask.bool()
    return torch.where(m, x, torch.zeros_like(x)).sum() / m.sum().clamp(min=1)


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k1"
) -> torch.Tensor:
    """Per-token estimate of KL(π‖π_ref) from tokens sampled by π (Schulman's k1/k2/k3).

    k1 = log π − log π_ref (unbiased, can be negative); k2 = ½(k1)² and
    k3 = e^{−k1} + k1 − 1 are ≥ 0. k3's exponent is clamped to ±20 so a stray token cannot produce inf.
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        neg = (-log_ratio).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        return torch.exp(neg) - neg - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}: expected k1, k2 or k3")


def _token_sum_mean(
    x: torch.Tensor, weights: torch.Tensor, normalizer: float | None
) -> torch.Tensor:
    """Σ w·x / normalizer (default Σ w): the weighted token mean, with masked entries zeroed."""
    total = torch.where(weights > 0, x * weights, torch.zeros_like(x)).sum()
    denom = weights.sum().clamp(min=1e-8) if normalizer is None else normalizer
    return total / denom


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio: float,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, Stats]:
    """PPO clipped surrogate, token-mean over valid tokens.

    Stats: ``clip_fraction`` (tokens where the clipped branch is the active max), ``approx_kl``
    (k3 of the old policy vs the new one: mean of (r − 1) − log r, as CleanRL), ``ratio_mean``.
    """
    m = mask.bool()
    log_ratio = (logprobs - old_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio)
    per_token = torch.maximum(unclipped, clipped)
    loss = _token_sum_mean(per_token, m.to(per_token.dtype), normalizer)
    with torch.no_grad():
        stats = {
            "clip_fraction": masked_mean((clipped > unclipped).float(), m),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, m),
            "ratio_mean": masked_mean(ratio, m),
        }
    return loss, stats


def value_weights(mask: torch.Tensor, first_token_weight: float = 1.0) -> torch.Tensor:
    """Per-token value-loss weights: 1 on valid tokens, ``first_token_weight`` on position 0."""
    weights = mask.float()
    if weights.shape[1] > 0:
        weights[:, 0] = weights[:, 0] * first_token_weight
    return weights


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """1 − Var(returns − values)/Var(returns) over valid tokens; NaN when Var(returns) is below
    RETURN_VARIANCE_FLOOR (near-constant returns: the ratio would say nothing about the fit)."""
    m = mask.bool()
    y, pred = returns[m].double(), values[m].double()
    var_y = y.var(unbiased=False) if y.numel() else y.new_tensor(0.0)
    if not explained_variance_meaningful(float(var_y)):
        return values.new_tensor(float("nan"), dtype=torch.float32)
    return (1.0 - (y - pred).var(unbiased=False) / var_y).float()


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_clip: float | None,
    first_token_weight: float = 1.0,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, Stats]:
    """½·max((V − R)², (V_clip − R)²), weighted token-mean; position 0 (V(state)) weighs more.

    V_clip = V_old + clamp(V − V_old, ±value_clip); ``value_clip=None`` disables clipping. The
    weights are normalised (Σ w, or ``normalizer``), so the loss stays a weighted mean.
    Stats: ``explained_variance``, ``value_mean``, ``value_clip_fraction``.
    """
    m = mask.bool()
    unclipped = (values - returns).square()
    if value_clip is None:
        per_token, clip_active = unclipped, torch.zeros_like(m)
    else:
        v_clip = old_values + (values - old_values).clamp(-value_clip, value_clip)
        clipped = (v_clip - returns).square()
        per_token, clip_active = torch.maximum(unclipped, clipped), clipped > unclipped
    weights = value_weights(m, first_token_weight).to(per_token.dtype)
    loss = 0.5 * _token_sum_mean(per_token, weights, normalizer)
    with torch.no_grad():
        stats = {
            "explained_variance": explained_variance(values.detach(), returns, m),
            "value_mean": masked_mean(values.detach(), m),
            "value_clip_fraction": masked_mean(clip_active.float(), m),
        }
    return loss, stats


def entropy_from_logits(
    logits: torch.Tensor, mask: torch.Tensor, chunk_size: int = 512
) -> torch.Tensor:
    """Mean entropy of the token distributions at valid positions.

    Only valid rows are gathered, then processed ``chunk_size`` tokens at a time in float32, so
    the float32 copy of [tokens, vocab] never exists all at once (vocab is ~50-150k).
    """
    rows = logits[mask.bool()]
    total = logits.new_zeros((), dtype=torch.float32)
    for chunk in rows.split(chunk_size):
        x = chunk.float()
        log_p = x - torch.logsumexp(x, dim=-1, keepdim=True)
        total = total - (log_p.exp() * log_p).sum()
    return total / max(rows.shape[0], 1)  # 0 where no position is valid


def _action_start(ids: list[int], tokenizer: Any) -> int:
    """Index of the token holding the first character of the last ``ACTION:`` tag (len if none).

    ids[:k] covers that character iff its decoding starts with the text up to it: monotone in k,
    so a binary search. Comparing text, not lengths, stays right when a prefix ends inside a
    multi-byte character, and needs no re-tokenisation of sampled, non-canonical ids.
    """
    def decode(part: list[int]) -> str:
        return tokenizer.decode(part, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    text = decode(ids)
    reply = parse_reply(text)
    if not reply.n_action_tags:
        return len(ids)
    head = text[: reply.action_start + 1]
    lo, hi = 1, len(ids)  # smallest k in [1, L] with decode(ids[:k]) covering head; L always does
    while lo < hi:
        mid = (lo + hi) // 2
        if decode(ids[:mid]).startswith(head):
            hi = mid
        else:
            lo = mid + 1
    return lo - 1


def think_action_masks(
    response_ids: list[list[int]], tokenizer: Any, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bool masks [B, R] (right-padded like the responses) of THINK and ACTION tokens, to log
    the KL of the two parts separately.

    ACTION: the token holding the first character of the last ``ACTION:`` tag (any case) and all
    after it, so a BPE token " ACTION" (space merged in) is ACTION while a separate "\\n" or " "
    token before the tag stays THINK. A response without a tag is all THINK.
    """
    width = max((len(r) for r in response_ids), default=0) if width is None else width
    think = torch.zeros(len(response_ids), width, dtype=torch.bool)
    action = torch.zeros_like(think)
    for row, ids in enumerate(response_ids):
        start = _action_start(list(ids), tokenizer)
        think[row, :start] = True
        action[row, start : len(ids)] = True
    return think, action
