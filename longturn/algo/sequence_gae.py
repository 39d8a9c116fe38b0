"""Dual-discount GAE over one sequence-mode episode: model tokens only, the step discount at each
observation gap.

A sequence is context and assistant segments interleaved. Its assistant segments play the role
of turns of §5: inside a segment the token discounts apply (γ_token, λ_token); from a segment's
last token to the next segment's first (across the tool result or user message between them) the
step discounts apply (γ_step, λ_step); context tokens get no value, reward or advantage. After the
last segment: 0 when the episode ended (`done`), the critic's value of the final context when it
was cut short (truncated by turns or by the token budget), like a time limit.
"""

from __future__ import annotations

from typing import Any

import torch

from longturn.algo.gae import GAEParams, dual_discount_gae


def sequence_gae(values: Any, rewards: Any, segment_starts: list[int], segment_ends: list[int],
                 done: bool, bootstrap_value: float, params: GAEParams
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns over a whole sequence ([L] each, 0 on context tokens).

    `values`/`rewards`: [L] per token of the sequence (only segment tokens are read);
    segments are [start, end) spans of sampled tokens in order; `bootstrap_value` is used only
    when not `done`."""
    v = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    if len(segment_starts) != len(segment_ends) or not segment_starts:
        raise ValueError("an episode needs at least one segment, with as many starts as ends")
    spans = list(zip(segment_starts, segment_ends))
    if any(not 0 <= s < e <= v.numel() for s, e in spans) or any(
            e > s2 for (_, e), (s2, _) in zip(spans, spans[1:])):
        raise ValueError(f"segments {spans} are not ordered, non-empty spans of {v.numel()} "
                         "tokens")
    index = torch.cat([torch.arange(s, e) for s, e in spans])
    lengths = torch.tensor([e - s for s, e in spans])
    seg_v = v[index]
    firsts = torch.cumsum(lengths, 0) - lengths  # first token of each segment in seg_v
    tail = torch.tensor([0.0 if done else float(bootstrap_value)], dtype=torch.float64)
    next_values = torch.cat([seg_v[firsts[1:]], tail])
    carries = torch.ones(len(spans), dtype=torch.float64)
    carries[-1] = 0.0
    adv, ret = dual_discount_gae(seg_v, r[index], lengths, next_values, carries, params)
    advantages, returns = torch.zeros_like(v), torch.zeros_like(v)
    advantages[index], returns[index] = adv.to(torch.float64), ret.to(torch.float64)
    return advantages, returns
