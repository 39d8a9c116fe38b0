"""The dual-discount GAE rule of docs/design.md §5 as plain loops, for tests to check the
vectorised and table code against: written from the rule, sharing no code with longturn.algo."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def reference_gae(values, rewards, lengths, next_values, carries, p) -> tuple[np.ndarray,
                                                                              np.ndarray]:
    """Advantages and returns of turns laid end to end (`lengths` tokens each), newest first:
    `next_values[t]` is the value after turn t, `carries[t]` whether turn t+1's advantage flows
    back into turn t."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    adv = np.zeros(len(values))
    next_first_adv = 0.0  # A_{t+1,0}
    for t in reversed(range(len(lengths))):
        s, n = int(starts[t]), int(lengths[t])
        v, r = values[s:s + n], rewards[s:s + n]
        a_turn = [0.0] * n
        delta = r[n - 1] + p.gamma_step * next_values[t] - v[n - 1]
        a_turn[n - 1] = delta + p.gamma_step * p.lambda_step * carries[t] * next_first_adv
        for k in reversed(range(n - 1)):
            delta = r[k] + p.gamma_token * v[k + 1] - v[k]
            a_turn[k] = delta + p.gamma_token * p.lambda_token * a_turn[k + 1]
        adv[s:s + n] = a_turn
        next_first_adv = a_turn[0]
    return adv, adv + np.asarray(values)


def packed_reference(values: Sequence[float], rewards: Sequence[float], mask: Sequence[int],
                     done: bool, bootstrap: float, p) -> list[float]:
    """Advantages over one whole episode's tokens (a packed sample's): walk backwards, skip
    context tokens (mask 0, advantage 0); the step discount applies where context separates two
    sampled tokens, the token discount otherwise; after the last one, 0 when the episode ended,
    else `bootstrap`, and no advantage carried from beyond."""
    n = len(values)
    adv = [0.0] * n
    next_v, next_a, gap = (0.0 if done else bootstrap), 0.0, True  # after the end: a gap
    first = True
    for i in reversed(range(n)):
        if not mask[i]:
            gap = True
            continue
        if first:
            adv[i] = rewards[i] + p.gamma_step * next_v - values[i]
            first = False
        elif gap:
            adv[i] = rewards[i] + p.gamma_step * next_v - values[i] + \
                p.gamma_step * p.lambda_step * next_a
        else:
            adv[i] = rewards[i] + p.gamma_token * next_v - values[i] + \
                p.gamma_token * p.lambda_token * next_a
        next_v, next_a, gap = values[i], adv[i], False
    return adv
