"""Dual-discount GAE (docs/design.md §5): the vectorised scan against the rule itself
(tests/gae_reference.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longturn.algo.gae import (
    GAEParams,
    carries_from_turns,
    dual_discount_gae,
    gae_for_table,
    masked_whiten,
)
from gae_reference import reference_gae


unit = st.floats(0.0, 1.0, allow_nan=False)


@st.composite
def batches(draw):
    """Several slots, each a run of turns of 1..20 tokens with random carries."""
    lengths, carries = [], []
    for _ in range(draw(st.integers(1, 4))):
        n_turns = draw(st.integers(1, 6))
        lengths += draw(st.lists(st.integers(1, 20), min_size=n_turns, max_size=n_turns))
        c = draw(st.lists(st.booleans(), min_size=n_turns, max_size=n_turns))
        carries += c[:-1] + [False]  # the next flat turn belongs to another slot
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = sum(lengths)
    params = GAEParams(draw(unit), draw(unit), draw(unit), draw(unit))
    return (rng.normal(size=n) * 3, rng.normal(size=n), np.array(lengths),
            rng.normal(size=len(lengths)) * 3, np.array(carries, dtype=float), params)


@settings(max_examples=300, deadline=None)
@given(batches())
def test_vectorised_matches_reference(batch):
    values, rewards, lengths, nv, carries, params = batch
    adv, ret = dual_discount_gae(values, rewards, lengths, nv, carries, params)
    ref_adv, ref_ret = reference_gae(values, rewards, lengths, nv, carries, params)
    assert adv.dtype == torch.float64
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=0, atol=1e-9)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=0, atol=1e-9)


def _gae(values, rewards, lengths, nv, carries, params):
    adv, ret = dual_discount_gae(np.array(values, float), np.array(rewards, float),
                                 np.array(lengths), np.array(nv, float),
                                 np.array(carries, float), params)
    return adv.numpy(), ret.numpy()


def test_terminated_hand_computed():
    # turn 0: V=[1,2] r=[0,1] next V=4 carried; turn 1: V=[4] r=[3], terminated.
    # t1: δ=3+0.5·0−4=−1 → A=−1.  t0 last: δ=1+0.5·4−2=1 → A=1+0.25·(−1)=0.75.
    # t0 k0: δ=0+2−1=1 → A=1+0.75=1.75.
    adv, ret = _gae([1, 2, 4], [0, 1, 3], [2, 1], [4, 0], [1, 0], GAEParams(0.5, 0.5))
    np.testing.assert_allclose(adv, [1.75, 0.75, -1.0], atol=1e-12)
    np.testing.assert_allclose(ret, [2.75, 2.75, 3.0], atol=1e-12)


def test_truncated_bootstrap_hand_computed():
    # One turn, V=[1,2] r=[0.5,1], truncated: bootstrap next_value 6, no carry.
    # last: δ=1+0.9·6−2=4.4.  k0: δ=0.5+0.5·2−1=0.5 → A=0.5+0.25·4.4=1.6.
    adv, ret = _gae([1, 2], [0.5, 1], [2], [6], [0], GAEParams(0.9, 0.8, 0.5, 0.5))
    np.testing.assert_allclose(adv, [1.6, 4.4], atol=1e-12)
    np.testing.assert_allclose(ret, [2.6, 6.4], atol=1e-12)


def _table(rows, perm):
    """Parquet-like columns from row dicts, rows shuffled by ``perm``."""
    rows = [rows[i] for i in perm]
    return {k: [r[k] for r in rows] for k in rows[0]}


def _row(env, step, ep, values, rewards, nv, term=False, seg=False, abort=False):
    return dict(env_index=env, step=step, episode_id=ep, values=values,
                token_rewards=rewards, next_value=nv, terminated=term,
                truncated=False, segment_end=seg, aborted=abort)


def test_segment_end_hand_computed_via_table():
    # γ_step=λ_step=0.5, γ_tok=1, λ_tok=0.5.  Slot 0, one episode, segment ends at t1:
    # t1 last: δ=2+0.5·5−1=3.5.  t1 k0: δ=0+1−3=−2 → A=−2+0.5·3.5=−0.25.
    # t0: δ=1+0.5·3−2=0.5 → A=0.5+0.25·(−0.25)=0.4375.   Slot 1: δ=1+0.5·2−1=1.
    rows = [_row(0, 0, "a", [2.0], [1.0], 3.0),
            _row(0, 1, "a", [3.0, 1.0], [0.0, 2.0], 5.0, seg=True),
            _row(1, 0, "b", [1.0], [1.0], 2.0, seg=True)]
    perm = [2, 0, 1]
    adv, ret = gae_for_table(_table(rows, perm), GAEParams(0.5, 0.5, 1.0, 0.5))
    expected_adv = [[1.0], [0.4375], [-0.25, 3.5]]  # rows in shuffled (given) order
    expected_ret = [[2.0], [2.4375], [2.75, 4.5]]
    for got, want in zip(adv, expected_adv):
        np.testing.assert_allclose(got, want, atol=1e-12)
    for got, want in zip(ret, expected_ret):
        np.testing.assert_allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("ending", ["terminated", "truncated"])
def test_episode_restarts_mid_segment(ending):
    # Slot 0: episode x ends at step 0, episode y runs steps 1-2 (segment end).
    # γ_step=λ_step=0.5, token level 1.  t2: δ=2+0.5·6−4=1.  t1 last: δ=1+0.5·4−3=0
    # → A=0.25·1=0.25; t1 k0: δ=3−2=1 → A=1.25.  t0 (no carry into y, 1.25 unused):
    # terminated: δ=2+0−1=1;  truncated with bootstrap 3: δ=2+0.5·3−1=2.5.
    nv0 = 0.0 if ending == "terminated" else 3.0
    rows = [_row(0, 0, "x", [1.0], [2.0], nv0, term=ending == "terminated"),
            _row(0, 1, "y", [2.0, 3.0], [0.0, 1.0], 4.0),
            _row(0, 2, "y", [4.0], [2.0], 6.0, seg=True)]
    adv, ret = gae_for_table(_table(rows, [1, 2, 0]), GAEParams(0.5, 0.5))
    a0 = 1.0 if ending == "terminated" else 2.5
    np.testing.assert_allclose(np.concatenate(adv), [1.25, 0.25, 1.0, a0], atol=1e-12)
    np.testing.assert_allclose(np.concatenate(ret), [3.25, 3.25, 5.0, 1.0 + a0],
                               atol=1e-12)


def test_zero_length_response_is_rejected():
    with pytest.raises(ValueError, match="turn 1"):
        _gae([1, 2, 3], [0, 0, 1], [2, 0, 1], [0, 0, 0], [0, 0, 0], GAEParams(1, 1))
    rows = [_row(0, 0, "a", [1.0], [1.0], 0.0), _row(0, 1, "a", [], [], 0.0, seg=True)]
    with pytest.raises(ValueError, match="row 1"):
        gae_for_table(_table(rows, [0, 1]), GAEParams(1, 1))


def test_token_level_one_gives_verlog_closed_form():
    # γ_tok=λ_tok=1, γ_step=0.9, λ_step=0.8, reward only on last tokens, t2 terminated.
    # G2 = 2;  G1 = 0 + 0.9·(0.2·1 + 0.8·2) = 1.62;
    # G0 = 1 + 0.9·(0.2·2 + 0.8·1.62) = 2.5264.  Every token of a turn shares G_t.
    p = GAEParams(0.9, 0.8)
    turns = [([0.5, 1.0], [0.0, 1.0]), ([2.0, 1.5, 3.0], [0.0, 0.0, 0.0]), ([1.0], [2.0])]
    values = sum((v for v, _ in turns), [])
    rewards = sum((r for _, r in turns), [])
    _, ret = _gae(values, rewards, [2, 3, 1], [2.0, 1.0, 0.0], [1, 1, 0], p)
    np.testing.assert_allclose(ret, [2.5264] * 2 + [1.62] * 3 + [2.0], atol=1e-12)
    g_next, v_next = 0.0, 0.0  # formula, newest first, terminal after t2
    for (v, r), got in zip(reversed(turns), [ret[5:], ret[2:5], ret[:2]]):
        g = r[-1] + p.gamma_step * ((1 - p.lambda_step) * v_next + p.lambda_step * g_next)
        np.testing.assert_allclose(got, g, atol=1e-12)
        g_next, v_next = g, v[0]


def test_long_sequence_is_finite_and_exact():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, size=7000)
    n = int(lengths.sum())
    assert n > 200_000
    values, rewards = rng.normal(size=n), rng.normal(size=n)
    nv, carries = rng.normal(size=lengths.size), (rng.random(lengths.size) < 0.98) * 1.0
    carries[-1] = 0
    p = GAEParams(0.99, 0.95, 1.0, 0.999)
    adv, ret = dual_discount_gae(values, rewards, lengths, nv, carries, p)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    ref_adv, _ = reference_gae(values, rewards, lengths, nv, carries, p)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-9, atol=1e-9)


def test_undiscounted_chain_is_a_reverse_cumsum():
    # γ=λ=1 everywhere and all carries: A_i = Σ_{j≥i} δ_j, over 100k tokens.
    n, lengths = 100_000, np.full(1000, 100)
    values = np.zeros(n)
    rewards = np.random.default_rng(1).normal(size=n)
    carries = np.ones(1000)
    carries[-1] = 0
    adv, _ = dual_discount_gae(values, rewards, lengths, np.zeros(1000), carries,
                               GAEParams(1.0, 1.0))
    np.testing.assert_allclose(adv.numpy(), np.cumsum(rewards[::-1])[::-1], atol=1e-8)


def test_dtypes_follow_values():
    args = ([1, 0], [2], [0.0], [0.0], GAEParams(0.5, 0.5))
    adv32, _ = dual_discount_gae(np.array([1.0, 2.0], np.float32), *args)
    adv64, _ = dual_discount_gae(torch.tensor([1.0, 2.0], dtype=torch.float64), *args)
    advls, _ = dual_discount_gae([1.0, 2.0], *args)
    assert (adv32.dtype, adv64.dtype, advls.dtype) == (torch.float32, torch.float64,
                                                       torch.float64)


def test_bad_inputs_are_rejected():
    p = GAEParams(0.5, 0.5)
    with pytest.raises(ValueError, match="sum"):
        _gae([1, 2], [0, 0], [1, 2], [0, 0], [0, 0], p)
    with pytest.raises(ValueError, match="carries\\[-1\\]"):
        _gae([1, 2], [0, 0], [1, 1], [0, 0], [1, 1], p)
    with pytest.raises(ValueError, match="0/1"):
        _gae([1, 2], [0, 0], [1, 1], [0, 0], [0.5, 0], p)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="gamma_step"):
            GAEParams(bad, 0.5)


def test_masked_whiten():
    rng = np.random.default_rng(2)
    x = torch.tensor(rng.normal(3.0, 5.0, size=(8, 50)))
    mask = torch.tensor(rng.random((8, 50)) < 0.6)
    out = masked_whiten(x, mask)
    assert out.dtype == x.dtype
    assert abs(out[mask].mean().item()) < 1e-9
    assert abs(out[mask].std(unbiased=False).item() - 1.0) < 1e-6  # biased std
    assert torch.equal(out[~mask], x[~mask])  # masked-out entries untouched
    one = masked_whiten(torch.tensor([5.0, 7.0]), torch.tensor([1, 0]))
    assert one.tolist() == [0.0, 7.0]
    with pytest.raises(ValueError, match="no entries"):
        masked_whiten(x, torch.zeros_like(mask))


def test_carries_from_shuffled_table():
    # (env, step, episode, terminated, aborted, segment_end); expected c_t in order.
    rows = [(0, 0, "a", 0, 0, 0, 1), (0, 1, "a", 1, 0, 0, 0), (0, 2, "b", 0, 0, 0, 1),
            (0, 3, "b", 0, 0, 1, 0),
            (1, 0, "c", 0, 0, 0, 0), (1, 1, "c", 0, 1, 0, 0), (1, 2, "c", 0, 0, 0, 1),
            (1, 3, "c", 0, 0, 1, 0),
            (2, 0, "d", 0, 0, 0, 0), (2, 1, "e", 0, 0, 0, 0), (2, 3, "e", 0, 0, 1, 0)]
    perm = np.random.default_rng(3).permutation(len(rows))
    cols = list(zip(*[rows[i] for i in perm]))
    order, carries = carries_from_turns(*cols[:6])
    np.testing.assert_array_equal(perm[order], np.arange(len(rows)))
    np.testing.assert_array_equal(carries, [bool(r[6]) for r in rows])
    assert carries.dtype == bool
    with pytest.raises(ValueError, match="ambiguous"):
        carries_from_turns([0, 0], [1, 1], ["a", "a"], [0, 0], [0, 0], [0, 1])
