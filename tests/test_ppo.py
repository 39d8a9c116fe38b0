"""PPO losses and KL terms on small hand-computed tensors; THINK/ACTION masks on the real tokenizer."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from longturn.algo.ppo import (
    entropy_from_logits,
    explained_variance,
    kl_penalty,
    masked_mean,
    policy_loss,
    think_action_masks,
    value_loss,
    value_weights,
)
from longturn.algo.sample_scoring import sample_token_rewards

MASK = torch.tensor([[True, True, True], [True, False, False]])


def test_masked_mean_ignores_masked_garbage() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), float("inf")]])
    assert masked_mean(x, MASK).item() == pytest.approx(2.5)
    assert masked_mean(x, torch.zeros_like(MASK)).item() == 0.0


def test_kl_estimators_on_known_numbers() -> None:
    logp, ref = torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-2.0, -1.0, -0.5])
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([1.0, -1.0, 0.0]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([0.5, 0.5, 0.0]))
    k3 = torch.tensor([math.exp(-1) + 1 - 1, math.exp(1) - 1 - 1, 0.0])
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), k3)
    assert kl_penalty(logp, ref).min() < 0  # k1 is the default and can be negative
    far = kl_penalty(torch.tensor([0.0, -500.0]), torch.tensor([-500.0, 0.0]), "k3")
    assert torch.isfinite(far).all() and (far >= 0).all()
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(logp, ref, "k4")  # type: ignore[arg-type]


def test_token_rewards_on_each_reply_last_token() -> None:
    old = np.array([0.1, 0.2, 0.3, 0.4, 9.0, 0.2], dtype=np.float32)
    mask = np.array([1, 1, 1, 1, 0, 1], dtype=np.float32)
    replies = [{"end": 3, "reward": 1.0}, {"end": 6, "reward": -2.0}]
    rewards = sample_token_rewards(old, np.zeros_like(old), mask, replies, 0.5, "k1")
    np.testing.assert_allclose(rewards, [-0.05, -0.1, 0.85, -0.2, 0.0, -2.1], atol=1e-6)


def _policy_case() -> tuple[torch.Tensor, ...]:
    ratios = torch.tensor([[1.5, 1.0, 0.5], [1.1, 7.0, 7.0]])
    logprobs = ratios.log() - 1.0
    logprobs[1, 1:] = 100.0  # garbage under the mask
    logprobs.requires_grad_(True)
    old = torch.full((2, 3), -1.0)
    advantages = torch.tensor([[1.0, 1.0, -1.0], [2.0, 5.0, 5.0]])
    return logprobs, old, advantages


def test_policy_loss_clipping_and_token_mean() -> None:
    logprobs, old, advantages = _policy_case()
    loss, stats = policy_loss(logprobs, old, advantages, MASK, clip_ratio=0.2)
    # per token: max(-1.5, -1.2) = -1.2 (clipped) | -1 | max(0.5, 0.8) = 0.8 (clipped) | -2.2
    assert loss.item() == pytest.approx((-1.2 - 1.0 + 0.8 - 2.2) / 4)  # token mean, not row mean
    assert stats["clip_fraction"].item() == pytest.approx(0.5)
    assert stats["ratio_mean"].item() == pytest.approx((1.5 + 1.0 + 0.5 + 1.1) / 4)
    kl = sum((r - 1) - math.log(r) for r in (1.5, 1.0, 0.5, 1.1)) / 4
    assert stats["approx_kl"].item() == pytest.approx(kl, rel=1e-5)
    loss.backward()
    # clipped tokens get no gradient; d(-A·r)/dlogp = -A·r, divided by the 4 tokens
    expected = torch.tensor([[0.0, -0.25, 0.0], [-0.55, 0.0, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected)


def test_policy_loss_inactive_clip_and_normalizer() -> None:
    logprobs, old, advantages = _policy_case()
    loss, stats = policy_loss(logprobs, old, advantages, MASK, clip_ratio=10.0)
    assert loss.item() == pytest.approx((-1.5 - 1.0 + 0.5 - 2.2) / 4)
    assert stats["clip_fraction"].item() == 0.0
    summed, _ = policy_loss(logprobs, old, advantages, MASK, clip_ratio=10.0, normalizer=8.0)
    assert summed.item() == pytest.approx((-1.5 - 1.0 + 0.5 - 2.2) / 8)


VALUES = torch.tensor([[1.0, 2.0, 0.0], [0.2, 5.0, 5.0]])
OLD_VALUES = torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
RETURNS = torch.tensor([[2.0, 3.0, 0.5], [1.0, 0.0, 0.0]])


def test_value_loss_clip_and_first_token_weight() -> None:
    values = VALUES.clone().requires_grad_(True)
    loss, stats = value_loss(values, OLD_VALUES, RETURNS, MASK, value_clip=0.5, first_token_weight=3.0)
    # (0,0): V_clip = 0.5 -> max(1, 2.25) = 2.25, weight 3 | 1 | 0.25 | (1,0): 0.64, weight 3
    assert loss.item() == pytest.approx(0.5 * (3 * 2.25 + 1.0 + 0.25 + 3 * 0.64) / 8)
    assert stats["value_clip_fraction"].item() == pytest.approx(0.25)
    assert stats["value_mean"].item() == pytest.approx(0.8)
    y, v = [2.0, 3.0, 0.5, 1.0], [1.0, 2.0, 0.0, 0.2]
    ev = 1 - statistics.pvariance([a - b for a, b in zip(y, v)]) / statistics.pvariance(y)
    assert stats["explained_variance"].item() == pytest.approx(ev, rel=1e-5)
    loss.backward()
    assert values.grad[0, 0] == 0.0 and values.grad[1, 1:].abs().sum() == 0  # clipped / masked
    assert values.grad[1, 0].item() == pytest.approx(3 * (0.2 - 1.0) / 8)


def test_value_loss_without_clip_and_plain_weights() -> None:
    loss, stats = value_loss(VALUES, OLD_VALUES, RETURNS, MASK, value_clip=None, first_token_weight=3.0)
    assert loss.item() == pytest.approx(0.5 * (3 * 1.0 + 1.0 + 0.25 + 3 * 0.64) / 8)
    assert stats["value_clip_fraction"].item() == 0.0
    plain, _ = value_loss(VALUES, OLD_VALUES, RETURNS, MASK, value_clip=None)
    assert plain.item() == pytest.approx(0.5 * (1.0 + 1.0 + 0.25 + 0.64) / 4)
    torch.testing.assert_close(value_weights(MASK, 3.0), torch.tensor([[3.0, 1, 1], [3, 0, 0]]))
    assert torch.isnan(explained_variance(VALUES, torch.ones(2, 3), MASK))


def test_entropy_from_logits() -> None:
    logits = torch.zeros(2, 3, 8)
    logits[0, 1] = torch.tensor([50.0] + [0.0] * 7)  # nearly deterministic
    logits[1, 1:] = float("nan")  # masked
    mask = torch.tensor([[True, False, True], [True, False, False]])
    assert entropy_from_logits(logits, mask).item() == pytest.approx(math.log(8))
    mask[0, 1] = True
    expected = (3 * math.log(8) + 0.0) / 4
    assert entropy_from_logits(logits, mask).item() == pytest.approx(expected, abs=1e-6)
    rand = torch.randn(2, 5, 11, dtype=torch.bfloat16, requires_grad=True)
    full = torch.ones(2, 5, dtype=torch.bool)
    chunked = entropy_from_logits(rand, full, chunk_size=3)
    direct = torch.distributions.Categorical(logits=rand.float()).entropy().mean()
    torch.testing.assert_close(chunked, direct)
    chunked.backward()
    assert rand.grad is not None and rand.grad.abs().sum() > 0


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


def _split(tokenizer, ids: list[int], think: torch.Tensor, action: torch.Tensor) -> tuple[str, str]:
    assert not (think & action).any() and int((think | action).sum()) == len(ids)
    n_think = int(think.sum())
    assert think[: n_think].all()  # THINK is a prefix, ACTION the rest
    return tokenizer.decode(ids[:n_think]), tokenizer.decode(ids[n_think:])


@pytest.mark.parametrize(
    ("text", "think_text", "action_text"),
    [
        ("THINK: go\nACTION: go forward<|im_end|>", "THINK: go\n", "ACTION: go forward<|im_end|>"),
        ("THINK: the key is red.<|im_end|>", "THINK: the key is red.<|im_end|>", ""),
        ("THINK: not ACTION: left but ACTION: go", "THINK: not ACTION: left but", " ACTION: go"),
        ("think: café ☃ action: pick up", "think: café ☃", " action: pick up"),
        ("ACTION: turn left", "", "ACTION: turn left"),
    ],
)
def test_think_action_masks(tokenizer, text: str, think_text: str, action_text: str) -> None:
    ids = tokenizer(text, add_special_tokens=False).input_ids
    think, action = think_action_masks([ids], tokenizer)
    assert _split(tokenizer, ids, think[0], action[0]) == (think_text, action_text)


def test_think_action_masks_batch_and_non_canonical_tokens(tokenizer) -> None:
    text = "THINK: é→ go\nACTION: go forward"
    # Byte-by-byte sampled tokens (not what the tokenizer would produce), split characters too.
    byte_ids = [tokenizer.convert_tokens_to_ids(ch) for tok in tokenizer.tokenize(text) for ch in tok]
    assert tokenizer.decode(byte_ids) == text
    canonical = tokenizer(text, add_special_tokens=False).input_ids
    think, action = think_action_masks([canonical, byte_ids, []], tokenizer)
    assert think.shape == action.shape == (3, len(byte_ids))
    for row, ids in enumerate([canonical, byte_ids]):
        n = len(ids)
        assert _split(tokenizer, ids, think[row, :n], action[row, :n]) == (
            "THINK: é→ go\n",
            "ACTION: go forward",
        )
        assert not (think[row, n:] | action[row, n:]).any()
    assert not (think[2] | action[2]).any()
