"""Shared-prefix scoring and training: the common prefix run once must give the same logprobs,
values and gradients as the plain layout, LoRA (all layers or the top ones) included."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from longturn.algo.lora import apply_lora
from longturn.engines.logprobs import pack_prompt_response, token_logprobs
from longturn.engines.logprobs import response_logits
from reference_forward import (random_head_critic, response_logprobs_tensor, response_values,
                               state_values)

PAD = 2
SHARED = list(range(100, 140))  # 40 tokens every prompt starts with
PROMPTS = [SHARED + [5, 17, 99, 3], SHARED + [7], SHARED + [1000, 2000, 300]]
RESPONSES = [[11, 12, 13], [14], [15, 16, 17, 18, 19]]


def _logprobs(model: torch.nn.Module, share: bool) -> torch.Tensor:
    batch = pack_prompt_response(PROMPTS, RESPONSES, PAD, "cpu", share_prefix=share)
    logprobs = token_logprobs(response_logits(model, batch), batch.response_ids)
    return logprobs.masked_fill(~batch.response_mask, 0.0)


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_layout_splits_off_the_common_prefix() -> None:
    batch = pack_prompt_response(PROMPTS, RESPONSES, PAD, share_prefix=True)
    assert batch.prefix_ids is not None and batch.prefix_ids[0].tolist() == SHARED
    assert batch.prompt_width == 4 and batch.input_ids.shape == (3, 4 + 5)
    assert batch.attention_mask.shape == (3, 40 + 4 + 5)
    # Every real token keeps the position it has in the full prompt.
    assert batch.position_ids[0, :5].tolist() == [40, 41, 42, 43, 44]
    assert batch.position_ids[1, 3:5].tolist() == [40, 41]  # "7" after three pads
    plain = pack_prompt_response(PROMPTS, RESPONSES, PAD)
    assert plain.prefix_ids is None and torch.equal(plain.response_mask, batch.response_mask)


@pytest.mark.parametrize("top_layers", [None, 1])
def test_actor_logprobs_and_gradients_match_plain_layout(tiny_model_dir: str,
                                                        top_layers: int | None) -> None:
    torch.manual_seed(0)
    actor = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir), top_layers=top_layers)
    for _, param in actor.named_parameters():
        if "lora_B" in _:  # non-zero B so the adapters change the output and get A-gradients
            torch.nn.init.normal_(param, std=0.05)
    results = {}
    for share in (False, True):
        actor.zero_grad()
        logprobs = _logprobs(actor, share)
        logprobs.sum().backward()
        results[share] = (logprobs.detach(), _grads(actor))
    torch.testing.assert_close(results[True][0], results[False][0], atol=1e-5, rtol=1e-5)
    plain, shared = results[False][1], results[True][1]
    assert plain.keys() == shared.keys() and plain
    for name in plain:
        torch.testing.assert_close(shared[name], plain[name], atol=1e-5, rtol=1e-4, msg=name)
    layers = {int(n.split(".layers.")[1].split(".")[0]) for n in plain}
    assert layers == ({0, 1} if top_layers is None else {1})  # only adapted layers train


def test_critic_values_and_gradients_match_plain_layout(tiny_model_dir: str) -> None:
    torch.manual_seed(0)
    critic = apply_lora(random_head_critic(tiny_model_dir, 0.5))
    results = {}
    for share in (False, True):
        critic.zero_grad()
        values, mask = response_values(critic, PROMPTS, RESPONSES, PAD, share_prefix=share)
        state = state_values(critic, PROMPTS, PAD, share_prefix=share)
        (values.sum() + state.sum()).backward()
        results[share] = (values.detach(), state.detach(), _grads(critic))
    torch.testing.assert_close(results[True][0], results[False][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(results[True][1], results[False][1], atol=1e-5, rtol=1e-5)
    for name, grad in results[False][2].items():
        torch.testing.assert_close(results[True][2][name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_no_shared_prefix_falls_back_to_plain(tiny_model_dir: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts, responses = [[5, 6, 7], [8, 9]], [[1, 2], [3]]
    batch = pack_prompt_response(prompts, responses, PAD, share_prefix=True)
    assert batch.prefix_ids is None
    with torch.no_grad():
        got = token_logprobs(response_logits(model, batch), batch.response_ids)
        expected, _ = response_logprobs_tensor(model, prompts, responses, PAD)
    torch.testing.assert_close(got.masked_fill(~batch.response_mask, 0), expected)
