"""Dual-discount GAE (docs/design.md §5), vectorised as one linear-recurrence scan.

The per-token rule is a first-order linear recurrence over the flat token order
(turns ordered by slot, then time):

    A_i = δ_i + a_i · A_{i+1},   A_N = 0

with a_i = γ_token·λ_token inside a turn, γ_step·λ_step·c_t at a turn's last token
(0 wherever the carry is cut). Such a recurrence composes associatively
((δ, a) ∘ (δ', a') = (δ + a·δ', a·a')), so it is solved with a blocked Hillis–Steele scan
(about log2 N doubling steps in all) instead of a Python loop over tokens. Only products of
coefficients in [0, 1] are formed, never divided by, so long sequences cannot blow up
(products may underflow to 0, which is then exact enough: the tail they scale is gone).
Arithmetic is always float64.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from longturn.algo.turn_grid import TurnGrid

ArrayLike = Any  # numpy array, torch tensor or a plain sequence of numbers
_NP_FLOATS = {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
              np.dtype(np.float64): torch.float64}
_BLOCK = 32  # tokens per row of the blocked scan (a power of two)


@dataclass(frozen=True)
class GAEParams:
    """Discounts of the two levels; defaults of the token level give Verlog's rule."""

    gamma_step: float
    lambda_step: float
    gamma_token: float = 1.0
    lambda_token: float = 1.0

    def __post_init__(self) -> None:
        for name in ("gamma_step", "lambda_step", "gamma_token", "lambda_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"GAEParams.{name} must be a float, got {value!r}")
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"GAEParams.{name} must be in [0, 1], got {value!r}")
            object.__setattr__(self, name, float(value))


def _out_dtype_device(x: ArrayLike) -> tuple[torch.dtype, torch.device]:
    """Dtype/device to hand results back in: the caller's, when it is a float."""
    if isinstance(x, torch.Tensor):
        return (x.dtype if x.is_floating_point() else torch.float64), x.device
    if isinstance(x, np.ndarray) and x.dtype in _NP_FLOATS:
        return _NP_FLOATS[x.dtype], torch.device("cpu")
    return torch.float64, torch.device("cpu")


def _f64(x: ArrayLike, device: torch.device) -> torch.Tensor:
    """1-D float64 tensor on ``device``; may alias the input, so never written to."""
    t = x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    return t.to(device=device, dtype=torch.float64).reshape(-1)


def _doubling(b: torch.Tensor, p: torch.Tensor) -> None:
    """Hillis–Steele along the last dim, in place on owned tensors.

    After the step with offset d, slot i holds (B_i, P_i) with A_i = B_i + P_i·A_{i+d}
    (the unknown lies past the row end once d reaches the row length).
    """
    d = 1
    while d < b.shape[-1]:
        b[..., :-d] += p[..., :-d] * b[..., d:]  # right side is built before the write
        p[..., :-d] = p[..., :-d] * p[..., d:]
        d *= 2


def linear_scan_reverse(delta: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """Solve A_i = delta_i + coef_i·A_{i+1} (A past the end = 0) for 1-D tensors.

    Blocked scan: rows of _BLOCK tokens are solved by doubling (log2 _BLOCK steps),
    leaving A_row = B + P·A_{next row start}; the row starts form the same recurrence
    _BLOCK× shorter, solved recursively, then one fix-up pass. O(N) work, O(log N) depth,
    versus O(N log N) for a flat doubling scan.
    """
    n = delta.shape[0]
    if n <= _BLOCK:
        b, p = delta.clone(), coef.clone()
        _doubling(b, p)
        return b
    rows = -(-n // _BLOCK)
    pad = delta.new_zeros(rows * _BLOCK - n)  # δ = 0, coef = 0: inert tail
    b = torch.cat([delta, pad]).view(rows, _BLOCK)
    p = torch.cat([coef, pad]).view(rows, _BLOCK)
    _doubling(b, p)
    heads = linear_scan_reverse(b[:, 0].contiguous(), p[:, 0].contiguous())
    next_head = torch.cat([heads[1:], heads.new_zeros(1)])
    return (b + p * next_head[:, None]).reshape(-1)[:n]


def _check_turns(lengths: torch.Tensor, n_tokens: int, next_values: torch.Tensor,
                 carries: torch.Tensor) -> None:
    """Reject malformed batches loudly (a zero-length turn would lose its reward)."""
    if lengths.ndim != 1 or lengths.numel() == 0:
        raise ValueError("turn_lengths must be a non-empty 1-D array")
    bad = torch.nonzero(lengths <= 0)
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"turn {i} has {int(lengths[i])} response tokens; every turn "
                         "needs at least one (its reward sits on the last token)")
    if int(lengths.sum()) != n_tokens:
        raise ValueError(f"sum(turn_lengths)={int(lengths.sum())} != {n_tokens} tokens")
    t = lengths.numel()
    if next_values.numel() != t or carries.numel() != t:
        raise ValueError(f"next_values ({next_values.numel()}) and carries "
                         f"({carries.numel()}) must have one entry per turn ({t})")
    if not bool(((carries == 0) | (carries == 1)).all()):
        raise ValueError("carries must be 0/1 flags")
    if bool(carries[-1] != 0):
        raise ValueError("carries[-1] must be 0: no turn follows the last one")


def dual_discount_gae(values: ArrayLike, rewards: ArrayLike, turn_lengths: ArrayLike,
                      next_values: ArrayLike, carries: ArrayLike,
                      params: GAEParams) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw advantages and returns (= A + V) for flat, slot-then-time ordered turns.

    ``values``/``rewards``: [N] response tokens of all turns concatenated;
    ``turn_lengths``: [T] ints summing to N; ``next_values``: [T] value after each
    turn's last token; ``carries``: [T] 1 iff the next turn in this order continues
    the same episode. Returns torch tensors in the float dtype and device of ``values`` when
    it is a float tensor or array, else float64.
    """
    dtype, device = _out_dtype_device(values)
    v, r = _f64(values, device), _f64(rewards, device)
    if v.shape != r.shape:
        raise ValueError(f"values {tuple(v.shape)} and rewards {tuple(r.shape)} differ")
    lengths = (turn_lengths if isinstance(turn_lengths, torch.Tensor)
               else torch.as_tensor(np.asarray(turn_lengths))).to(device).reshape(-1)
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise TypeError("turn_lengths must be integers")
    nv, c = _f64(next_values, device), _f64(carries, device)
    _check_turns(lengths, v.numel(), nv, c)

    ends = torch.cumsum(lengths.to(torch.int64), 0) - 1  # last token of each turn
    gamma = torch.full_like(v, params.gamma_token)
    gamma[ends] = params.gamma_step
    v_next = torch.cat([v[1:], v.new_zeros(1)])
    v_next[ends] = nv
    delta = r + gamma * v_next - v
    coef = torch.full_like(v, params.gamma_token * params.lambda_token)
    coef[ends] = params.gamma_step * params.lambda_step * c
    adv = linear_scan_reverse(delta, coef)
    ret = adv + v
    return adv.to(dtype), ret.to(dtype)


def masked_whiten(x: ArrayLike, mask: ArrayLike, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean)/sqrt(var + eps) with mean/var over mask != 0 (biased variance).

    Biased (population) variance keeps a one-entry mask finite. Entries where the
    mask is 0 are returned unchanged (they are excluded from the loss anyway).
    Returns a torch tensor with x's float dtype (float64 otherwise).
    """
    dtype, device = _out_dtype_device(x)
    xt = x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    xt = xt.to(device=device, dtype=torch.float64)
    mt = mask if isinstance(mask, torch.Tensor) else torch.as_tensor(np.asarray(mask))
    m = mt.to(device) != 0
    if m.shape != xt.shape:
        raise ValueError(f"mask {tuple(m.shape)} and x {tuple(xt.shape)} differ in shape")
    count = int(m.sum())
    if count == 0:
        raise ValueError("masked_whiten: mask selects no entries")
    mean = xt[m].sum() / count
    var = ((xt[m] - mean) ** 2).sum() / count
    out = torch.where(m, (xt - mean) * torch.rsqrt(var + eps), xt)
    return out.to(dtype)


def carries_from_turns(env_index: ArrayLike, step: ArrayLike, episode_id: ArrayLike,
                       terminated: ArrayLike, aborted: ArrayLike, segment_end: ArrayLike,
                       iteration: ArrayLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Order turns slot by slot (the TurnGrid's slot-major order) and derive each turn's carry c_t.

    Returns ``(order, carries)``: ``order`` is the int64 permutation of rows, ``carries``
    the bool c_t of each turn *in that order*. c_t = 1 iff the next turn is in the same
    slot (and iteration), exactly one step later, in the same episode, and neither
    turn t nor turn t+1 is aborted, and turn t is not terminated nor a segment end.
    An aborted turn cuts the carry into it too: its reward/value come from a failed
    env, so earlier turns must not inherit its advantage. The caller's ``next_value``
    for the turn before it is used as given (a bootstrap, not the aborted turn's V).
    """
    grid = TurnGrid.build(env_index, step, episode_id, iteration)
    order = grid.slot_major_order()
    term, abrt, seg = (np.asarray(f, dtype=bool) for f in (terminated, aborted, segment_end))
    carries = np.zeros(len(order), dtype=bool)
    if len(order) > 1:
        now, later = order[:-1], order[1:]
        carries[:-1] = ((grid.next_row[now] == later) & ~term[now] & ~abrt[now] & ~seg[now]
                        & ~abrt[later])
    return order, carries


_ORDER_COLS = ("env_index", "step", "episode_id", "terminated", "aborted", "segment_end")


def gae_for_table(columns: Mapping[str, Sequence[Any]],
                  params: GAEParams) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-turn advantages/returns (float64 numpy) for Parquet-style columns (§4).

    Needs list columns ``values``, ``token_rewards``, scalar ``next_value`` and the
    ordering columns (``iteration`` optional); results are in the ORIGINAL row order.
    """
    vals = [np.asarray(v, dtype=np.float64) for v in columns["values"]]
    rews = [np.asarray(r, dtype=np.float64) for r in columns["token_rewards"]]
    for row, (v, r) in enumerate(zip(vals, rews, strict=True)):
        if v.size == 0:
            raise ValueError(f"row {row}: turn has zero response tokens")
        if v.shape != r.shape:
            raise ValueError(f"row {row}: {v.size} values but {r.size} token_rewards")
    order, carries = carries_from_turns(*(columns[k] for k in _ORDER_COLS),
                                        iteration=columns.get("iteration"))
    lengths = np.array([vals[i].size for i in order], dtype=np.int64)
    nv = np.asarray(columns["next_value"], dtype=np.float64)[order]
    adv, ret = dual_discount_gae(np.concatenate([vals[i] for i in order]),
                                 np.concatenate([rews[i] for i in order]),
                                 lengths, nv, carries, params)
    cuts, back = np.cumsum(lengths)[:-1], np.argsort(order)
    adv_rows, ret_rows = np.split(adv.numpy(), cuts), np.split(ret.numpy(), cuts)
    return [adv_rows[k] for k in back], [ret_rows[k] for k in back]
