"""Sequence-mode GAE against a plain backward loop over the whole token sequence."""

from __future__ import annotations

import random

import pytest
import torch

from longturn.algo.gae import GAEParams
from longturn.algo.sequence_gae import sequence_gae


def reference(values, rewards, mask, done, bootstrap, p: GAEParams):
    """Walk the sequence backwards; skip context tokens; the step discount applies when a
    context gap separates two model tokens, the token discount otherwise."""
    n = len(values)
    adv = [0.0] * n
    next_v, next_a, gap = (0.0 if done else bootstrap), 0.0, True  # after the end: a gap
    first = True
    for i in reversed(range(n)):
        if not mask[i]:
            gap = True
            continue
        if first:  # the last model token: bootstrap (or 0), no advantage carried from beyond
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


def random_episode(rng: random.Random):
    mask, starts, ends = [], [], []
    for _ in range(rng.randint(1, 5)):
        mask += [0] * rng.randint(1, 6)
        starts.append(len(mask))
        mask += [1] * rng.randint(1, 7)
        ends.append(len(mask))
    mask += [0] * rng.randint(0, 3)
    n = len(mask)
    return ([rng.uniform(-1, 1) for _ in range(n)], [rng.uniform(-1, 1) for _ in range(n)],
            mask, starts, ends)


@pytest.mark.parametrize("seed", range(30))
def test_matches_the_plain_loop(seed):
    rng = random.Random(seed)
    values, rewards, mask, starts, ends = random_episode(rng)
    params = GAEParams(gamma_step=rng.choice([0.9, 0.99, 1.0]), lambda_step=rng.choice([0.8, 0.95]),
                       gamma_token=rng.choice([1.0, 0.97]), lambda_token=rng.choice([1.0, 0.9]))
    done, bootstrap = rng.random() < 0.5, rng.uniform(-1, 1)
    adv, ret = sequence_gae(values, rewards, starts, ends, done, bootstrap, params)
    expected = reference(values, rewards, mask, done, bootstrap, params)
    assert torch.allclose(adv, torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(ret[torch.tensor(mask, dtype=torch.bool)],
                          (adv + torch.tensor(values, dtype=torch.float64))[
                              torch.tensor(mask, dtype=torch.bool)])
    context = torch.tensor(mask) == 0
    assert (adv[context] == 0).all() and (ret[context] == 0).all()


def test_hand_computed_two_segments():
    # context, [a0 a1], context, [b0], context; gamma_step 0.5, lambda_step 1, token level 1
    values = [9, 0.2, 0.4, 9, 0.6, 9]
    rewards = [9, 0.0, 0.0, 9, 1.0, 9]
    p = GAEParams(gamma_step=0.5, lambda_step=1.0)
    adv, _ = sequence_gae(values, rewards, [1, 4], [3, 5], True, 0.0, p)
    # b0: 1 − 0.6 = 0.4; a1: 0 + 0.5·0.6 − 0.4 + 0.5·0.4 = 0.1; a0: 0 + 0.4 − 0.2 + 0.1 = 0.3
    assert adv.tolist() == pytest.approx([0, 0.3, 0.1, 0, 0.4, 0])
    truncated, _ = sequence_gae(values, rewards, [1, 4], [3, 5], False, 2.0, p)
    assert truncated[4].item() == pytest.approx(1 + 0.5 * 2 - 0.6)


def test_bad_segments_are_refused():
    p = GAEParams(gamma_step=1.0, lambda_step=1.0)
    with pytest.raises(ValueError, match="not ordered"):
        sequence_gae([0.0] * 5, [0.0] * 5, [3, 1], [4, 2], True, 0.0, p)
    with pytest.raises(ValueError, match="at least one segment"):
        sequence_gae([0.0] * 5, [0.0] * 5, [], [], True, 0.0, p)
