"""The split forward: piece-by-piece equals the whole model; a shared trunk gives the same actor,
reference and critic outputs as separate forwards; gradient checkpointing gives the same
gradients; the trunk is not shared when the bottoms differ."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from longturn.algo.critic import ValueModel, packed_response_values, packed_state_values
from longturn.engines.decoder_stack import decoder_of
from longturn.algo.lora import apply_lora
from longturn.algo.model_set import ModelSet
from longturn.algo.trunk import TrunkState, run_branch
from longturn.engines.logprobs import pack_prompt_response, response_logits, token_logprobs
from reference_forward import random_head_critic

PAD = 2
SHARED = list(range(100, 140))
PROMPTS = [SHARED + [5, 17, 99, 3], SHARED + [7], SHARED + [1000, 2000, 300]]
RESPONSES = [[11, 12, 13], [14], [15, 16, 17, 18, 19]]


def _perturb_lora(model: torch.nn.Module, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.05)


def _models(model_dir: str, top_layers: int | None):
    """Actor and critic with LoRA on the top layers (non-zero B, so adapters matter)."""
    torch.manual_seed(0)
    actor = apply_lora(AutoModelForCausalLM.from_pretrained(model_dir), top_layers=top_layers)
    critic = apply_lora(random_head_critic(model_dir, 0.3), top_layers=top_layers)
    _perturb_lora(actor, 1)
    _perturb_lora(critic, 2)
    return actor.eval(), critic.eval()


@pytest.mark.parametrize("share", [False, True])
def test_piecewise_forward_equals_the_whole_model(tiny_model_dir, share) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    batch = pack_prompt_response(PROMPTS, RESPONSES, PAD, share_prefix=share)
    with torch.no_grad():
        hidden = run_branch(decoder_of(model), TrunkState(0), batch)
        whole = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                            position_ids=batch.position_ids).last_hidden_state if not share else None
        logits = model.lm_head(hidden)[:, batch.prompt_width - 1 : -1]
        expected = response_logits(model, batch)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    if whole is not None:
        assert torch.equal(hidden, whole)


@pytest.mark.parametrize("share_prefix", [False, True])
def test_shared_trunk_matches_separate_models(tiny_model_dir, share_prefix) -> None:
    actor, critic = _models(tiny_model_dir, top_layers=1)
    shared = ModelSet(actor, None, critic, share_trunk=True)
    separate = ModelSet(actor, None, critic, share_trunk=False)
    assert shared.depth == 1 and separate.depth == 0
    batch = pack_prompt_response(PROMPTS, RESPONSES, PAD, share_prefix=share_prefix)
    states = pack_prompt_response(PROMPTS, [[] for _ in PROMPTS], PAD, share_prefix=share_prefix)
    with torch.no_grad():
        got = _outputs(shared, batch, states)
        want = _outputs(separate, batch, states)
        whole = (response_logits(actor, batch), _tempered(response_logits(actor, batch), batch))
        with actor.disable_adapter():
            whole += (_tempered(response_logits(actor, batch), batch),)
        whole += (packed_response_values(critic, batch), packed_state_values(critic, states))
    for a, b, c in zip(got, want, whole):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got[1], got[2])  # the adapters do change the actor


T = 0.7


def _tempered(logits: torch.Tensor, batch) -> torch.Tensor:
    logprobs = token_logprobs(logits.float() / T, batch.response_ids)
    return logprobs.masked_fill(~batch.response_mask, 0.0)


def _outputs(models: ModelSet, batch, states) -> tuple[torch.Tensor, ...]:
    trunk = models.trunk(batch)
    return (models.actor_logits(batch, trunk), models.policy_logprobs(batch, trunk, T)[0],
            models.policy_logprobs(batch, trunk, T, reference=True)[0],
            models.values(batch, trunk), models.state_values(states, models.trunk(states)))


def test_logprobs_in_row_chunks_equal_the_whole_batch(tiny_model_dir, monkeypatch) -> None:
    """Scoring applies the LM head a few rows at a time (bounded memory): same numbers."""
    from longturn.algo import model_set

    actor, critic = _models(tiny_model_dir, top_layers=1)
    models = ModelSet(actor, None, critic)
    batch = pack_prompt_response(PROMPTS, RESPONSES, PAD, share_prefix=True)
    with torch.no_grad():
        whole = models.policy_logprobs(batch, models.trunk(batch), T)
        monkeypatch.setattr(model_set, "LOGIT_ELEMENTS", 1)  # one row per chunk
        chunked = models.policy_logprobs(batch, models.trunk(batch), T)
        raw = _tempered(response_logits(actor, batch) * T, batch)  # T·z / T: untempered
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(whole[1], raw, atol=1e-5, rtol=1e-5)


def test_no_shared_trunk_when_bottoms_differ_or_everything_trains(tiny_model_dir) -> None:
    actor, critic = _models(tiny_model_dir, top_layers=1)
    with torch.no_grad():
        decoder_of(critic).layers[0].mlp.up_proj.weight.add_(1e-3)
    assert ModelSet(actor, None, critic).depth == 0
    actor, critic = _models(tiny_model_dir, top_layers=None)  # adapters on every layer
    assert ModelSet(actor, None, critic).depth == 0
    full = AutoModelForCausalLM.from_pretrained(tiny_model_dir)  # full fine-tuning
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir).requires_grad_(False)
    assert ModelSet(full, ref, ValueModel.from_pretrained(tiny_model_dir)).depth == 0


@pytest.mark.parametrize("share_prefix", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir, share_prefix) -> None:
    results = []
    for checkpoint in (False, True):
        actor, critic = _models(tiny_model_dir, top_layers=1)
        models = ModelSet(actor.train(), None, critic.train(), gradient_checkpointing=checkpoint)
        calls = []
        top = decoder_of(actor).layers[-1]
        hook = top.register_forward_pre_hook(lambda *_: calls.append(1))
        batch = pack_prompt_response(PROMPTS, RESPONSES, PAD, share_prefix=share_prefix)
        trunk = models.trunk(batch)
        loss = models.actor_logits(batch, trunk).logsumexp(-1).mean()
        loss = loss + models.values(batch, trunk).square().mean()
        loss.backward()
        hook.remove()
        grads = {f"{tag}.{n}": p.grad.clone() for tag, m in (("a", actor), ("c", critic))
                 for n, p in m.named_parameters() if p.grad is not None}
        results.append((float(loss.detach()), grads, len(calls)))
    (loss_a, grads_a, calls_a), (loss_b, grads_b, calls_b) = results
    prefix_pass = 1 if share_prefix else 0  # the prefix pass keeps its activations
    assert (calls_a, calls_b) == (1 + prefix_pass, 2 + prefix_pass)  # recomputed in backward
    assert loss_a == pytest.approx(loss_b, abs=1e-6)
    assert grads_a.keys() == grads_b.keys() and any("lora_A" in k for k in grads_a)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-6, rtol=1e-5)
