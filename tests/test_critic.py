"""Critic (ValueModel): position alignment with the logprob layout, padding invariance, save/load,
LoRA on the critic and the actor's merged save."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from longturn.algo.critic import VALUE_HEAD_FILE, ValueModel
from longturn.algo.lora import apply_lora, merge_and_save
from reference_forward import (random_head_critic, response_logprobs_tensor, response_values,
                               state_values)

PAD = 2
PROMPTS = [[5, 17, 99, 3, 41], [7, 8], [1000, 2000, 300]]
RESPONSES = [[11, 12, 13], [14], [15, 16, 17, 18, 19]]


@pytest.fixture(scope="module")
def critic_dir(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A saved critic with a random (non-zero) head, so values are not trivially 0."""
    torch.manual_seed(1)
    critic = random_head_critic(tiny_model_dir, 0.5)
    out = tmp_path_factory.mktemp("critic")
    critic.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def critic(critic_dir: str) -> ValueModel:
    return ValueModel.from_pretrained(critic_dir).eval()


def test_fresh_critic_from_causal_lm_dir(tiny_model_dir: str) -> None:
    assert not (Path(tiny_model_dir) / VALUE_HEAD_FILE).exists()
    critic = ValueModel.from_pretrained(tiny_model_dir)
    assert not hasattr(critic.backbone, "lm_head")
    assert torch.count_nonzero(critic.value_head.weight) == 0  # documented zero init
    with torch.no_grad():
        values, mask = response_values(critic, PROMPTS, RESPONSES, PAD)
    assert values.dtype == torch.float32 and torch.all(values[mask] == 0)
    # The backbone carries the causal LM's trained weights, not a fresh init.
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.testing.assert_close(critic.backbone.embed_tokens.weight, lm.model.embed_tokens.weight)
    torch.testing.assert_close(
        critic.backbone.layers[1].mlp.down_proj.weight, lm.model.layers[1].mlp.down_proj.weight
    )


def test_values_shape_mask_and_first_is_state_value(critic: ValueModel) -> None:
    with torch.no_grad():
        values, mask = response_values(critic, PROMPTS, RESPONSES, PAD)
        v_state = state_values(critic, PROMPTS, PAD)
    assert values.shape == mask.shape == (3, 5) and values.dtype == torch.float32
    assert mask.sum(1).tolist() == [3, 1, 5]
    assert torch.all(values[~mask] == 0) and torch.all(values[mask] != 0)
    assert v_state.shape == (3,)
    torch.testing.assert_close(values[:, 0], v_state, atol=1e-6, rtol=1e-6)


def test_values_align_with_logprob_positions(critic: ValueModel) -> None:
    """values[k] uses the same column (token before k) as logprob[k], and sees only its prefix."""
    with torch.no_grad():
        full, _ = response_values(critic, PROMPTS[:1], RESPONSES[:1], PAD)
        for k in range(1, len(RESPONSES[0])):  # V before token k = V(state = prompt + response[:k])
            prefix = state_values(critic, [PROMPTS[0] + RESPONSES[0][:k]], PAD)
            torch.testing.assert_close(full[0, k], prefix[0], atol=1e-5, rtol=0)


def test_left_padding_invariance(critic: ValueModel) -> None:
    with torch.no_grad():
        batch, mask = response_values(critic, PROMPTS, RESPONSES, PAD)
        for row, (prompt, response) in enumerate(zip(PROMPTS, RESPONSES)):
            alone, _ = response_values(critic, [prompt], [response], PAD)
            torch.testing.assert_close(batch[row, : len(response)], alone[0], atol=1e-5, rtol=0)


def test_save_load_round_trip(critic: ValueModel, tmp_path: Path, smollm2_tokenizer_dir: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    critic.save_pretrained(tmp_path, tokenizer=tokenizer)
    assert (tmp_path / VALUE_HEAD_FILE).is_file() and (tmp_path / "tokenizer.json").is_file()
    again = ValueModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        before, _ = response_values(critic, PROMPTS, RESPONSES, PAD)
        after, _ = response_values(again, PROMPTS, RESPONSES, PAD)
    assert torch.equal(before, after)


def test_lora_is_applied_without_a_deprecation_warning(tiny_model_dir: str) -> None:
    """peft 0.21 reads an alias transformers 5 deprecates: every train stage logged the warning."""
    from transformers import AutoModelForCausalLM

    actor = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    critic = ValueModel.from_pretrained(tiny_model_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_lora(actor)
        apply_lora(critic)
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []


def test_lora_critic_trains_only_adapters_and_head(critic_dir: str, tmp_path: Path) -> None:
    critic = apply_lora(ValueModel.from_pretrained(critic_dir), r=4, alpha=8)
    assert isinstance(critic, ValueModel)
    trainable = {name for name, p in critic.named_parameters() if p.requires_grad}
    assert {"value_head.weight", "value_head.bias"} <= trainable
    assert all("lora_" in name or name.startswith("value_head.") for name in trainable)
    assert any("lora_A" in name for name in trainable) and any("lora_B" in name for name in trainable)
    values, mask = response_values(critic, PROMPTS, RESPONSES, PAD)
    (values[mask] - 1.0).square().mean().backward()
    grads = {name: p.grad for name, p in critic.named_parameters() if p.requires_grad}
    assert grads["value_head.weight"].abs().sum() > 0
    assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items() if "lora_A" in n or "lora_B" in n)
    assert all(p.grad is None for p in critic.parameters() if not p.requires_grad)
    # A LoRA critic saves as a plain backbone dir (LoRA merged) that loads to the same values.
    with torch.no_grad():
        for p in critic.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
        critic.eval()
        expected, _ = response_values(critic, PROMPTS, RESPONSES, PAD)
    critic.save_pretrained(tmp_path)
    plain = ValueModel.from_pretrained(tmp_path).eval()
    assert not any("lora_" in name for name, _ in plain.named_parameters())
    with torch.no_grad():
        got, _ = response_values(plain, PROMPTS, RESPONSES, PAD)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_merge_and_save_actor(tiny_model_dir: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        reference, _ = response_logprobs_tensor(base, PROMPTS, RESPONSES, PAD)
    actor = apply_lora(base, r=4, alpha=8)
    optimizer = torch.optim.SGD([p for p in actor.parameters() if p.requires_grad], lr=1.0)
    for _ in range(2):  # lora_B starts at 0: the first step only moves B, the second moves outputs
        logprobs, mask = response_logprobs_tensor(actor, PROMPTS, RESPONSES, PAD)
        (-logprobs[mask].mean()).backward()
        optimizer.step()
        optimizer.zero_grad()
    actor.eval()
    with torch.no_grad():
        trained, _ = response_logprobs_tensor(actor, PROMPTS, RESPONSES, PAD)
    assert (trained - reference).abs().max() > 1e-3  # the LoRA step changed the outputs
    merge_and_save(actor, tmp_path)
    assert any("lora_" in name for name, _ in actor.named_parameters())  # the actor is untouched
    merged = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    with torch.no_grad():
        got, _ = response_logprobs_tensor(merged, PROMPTS, RESPONSES, PAD)
        logits_peft = actor(input_ids=torch.tensor([PROMPTS[0]])).logits
        logits_merged = merged(input_ids=torch.tensor([PROMPTS[0]])).logits
    torch.testing.assert_close(got, trained, atol=1e-4, rtol=0)
    torch.testing.assert_close(logits_merged, logits_peft, atol=1e-4, rtol=0)
