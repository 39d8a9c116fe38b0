"""Batched, seeded token sampling that never leaves the device.

Each prompt has its own 63-bit seed (`row_seeds.row_seed`); the uniform it draws at decode step t
is a hash of (seed, t) computed with integer tensor ops, so a whole batch samples with a handful
of kernels, with no per-row generator, no host round trip, and with shapes a CUDA graph can
capture. A prompt's draws depend only on its seed and the step, never on the other rows.

The hash is murmur3's 32-bit finaliser, chained over the seed's two 32-bit halves and the step,
with two salts for the two halves of a 53-bit uniform. 32-bit products are formed from 16-bit
pieces so every intermediate fits in int64 (no reliance on signed overflow).
"""

from __future__ import annotations

import torch

from longturn.engines.base import SamplingParams

_M32 = 0xFFFFFFFF
_SALTS = (0x243F6A88, 0x85A308D3)


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2^32 for x in [0, 2^32), without int64 overflow."""
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def _hash32(seeds: torch.Tensor, step: torch.Tensor, salt: int) -> torch.Tensor:
    h = _fmix32((_mul32(step & _M32, 0x9E3779B9) + salt) & _M32)
    h = _fmix32(h ^ (seeds & _M32))
    return _fmix32(h ^ ((seeds >> 32) & _M32))


def counter_uniforms(seeds: torch.Tensor, step: torch.Tensor | int) -> torch.Tensor:
    """float64 uniforms in [0, 1), one per seed, for decode step `step` (a 0-d tensor on the
    seeds' device inside a captured graph, or an int)."""
    step = torch.as_tensor(step, dtype=torch.int64, device=seeds.device)
    high = _hash32(seeds, step, _SALTS[0]) >> 5  # 27 bits
    low = _hash32(seeds, step, _SALTS[1]) >> 6  # 26 bits
    return (high * 67108864 + low).double() * (1.0 / 9007199254740992.0)


def filter_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Tempered, top-k / top-p filtered float32 scores [B, V]; removed entries are -inf."""
    scores = logits.float() / sampling.temperature
    vocab = scores.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = sorted_scores.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # keep the smallest prefix reaching top_p
        drop_sorted = mass_before >= sampling.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def sample_tokens(logits: torch.Tensor, sampling: SamplingParams, seeds: torch.Tensor,
                  step: torch.Tensor | int) -> torch.Tensor:
    """Next token per row: argmax at temperature 0, else inverse-CDF sampling with the row's
    counter uniform (a token with zero probability is never chosen)."""
    if sampling.temperature <= 0:
        return logits.argmax(-1)
    cdf = filter_logits(logits, sampling).softmax(-1).double().cumsum(-1)
    targets = (counter_uniforms(seeds, step) * cdf[:, -1]).unsqueeze(-1)
    chosen = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    return chosen.clamp(max=cdf.shape[-1] - 1)
