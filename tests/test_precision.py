"""Precision is what params say, in scoring and inside DeepSpeed: the update's first logprobs equal
the scored old logprobs (one epoch, one mini-batch), and the engines' own forward runs in bf16
when `bf16` is on (DeepSpeed's torch_autocast section), in fp32 when it is off."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import AutoTokenizer

from longturn.algo import ppo_steps
from reference_forward import random_head_critic
from longturn.algo.gae import GAEParams
from longturn.algo.trainer import PPOTrainer, ds_config
from turn_rows import samples_from_turns
from longturn.trajectories import write_samples
from trainer_settings import make_settings
from two_rank_update import make_rows

GAE = GAEParams(gamma_step=0.99, lambda_step=0.95)
SHARED = list(range(300, 340))  # a common prompt prefix, as agent prompts have


@pytest.fixture(scope="module")
def critic_dir(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    torch.manual_seed(3)
    out = tmp_path_factory.mktemp("critic_precision")
    random_head_critic(tiny_model_dir, 0.3).save_pretrained(out)
    return str(out)


def _rows(tokenizer) -> list[dict]:
    rows = make_rows(11, tokenizer, n_slots=3, n_steps=4)
    for row in rows:
        row["prompt_ids"] = SHARED + row["prompt_ids"]
        if row.get("bootstrap_prompt_ids"):
            row["bootstrap_prompt_ids"] = SHARED + row["bootstrap_prompt_ids"]
    return rows


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp32"])
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_first_update_logprobs_equal_scored_old_logprobs(tiny_model_dir, critic_dir, tmp_path,
                                                         monkeypatch, bf16, lora) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = _rows(tokenizer)
    settings = make_settings(actor_lr=1e-3, critic_lr=1e-3, temperature=0.7, ppo_epochs=1,
                               mini_batch_size=len(rows), micro_batch_size=len(rows), bf16=bf16,
                               lora=lora, lora_layers=1, share_prefix=True, seed=4)
    seen = []
    real = ppo_steps.policy_loss

    def spy(logprobs, old_logprobs, advantages, mask, *args, **kwargs):
        seen.append((logprobs.detach().clone(), old_logprobs.clone(), mask.clone()))
        return real(logprobs, old_logprobs, advantages, mask, *args, **kwargs)

    monkeypatch.setattr(ppo_steps, "policy_loss", spy)
    trainer = PPOTrainer(tiny_model_dir, critic_dir, settings, GAE, tokenizer)
    assert trainer.models.depth == (1 if lora else 0)
    path = write_samples(trainer.score(samples_from_turns(rows)), tmp_path / "samples.parquet")
    metrics = trainer.update([str(path)])
    new, old, mask = seen[0]  # the only mini-batch: before any optimizer step
    delta = float((new - old).abs()[mask].max())
    assert delta <= 1e-3, delta
    assert metrics["clip_fraction"] == 0.0 and abs(metrics["approx_kl"]) < 1e-6


@pytest.mark.parametrize("bf16", [True, False])
def test_deepspeed_engine_forward_runs_in_the_configured_precision(tiny_model_dir, critic_dir,
                                                                   bf16) -> None:
    settings = make_settings(bf16=bf16, mini_batch_size=2, micro_batch_size=2)
    config = ds_config(settings)
    assert ("torch_autocast" in config) == bf16
    assert config["bf16"] == {"enabled": False}  # fp32 master weights either way
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer = PPOTrainer(tiny_model_dir, critic_dir, settings, GAE, tokenizer)
    dtypes = []
    layer = trainer.actor_module.model.layers[0].mlp.down_proj
    hook = layer.register_forward_hook(lambda _m, _i, out: dtypes.append(out.dtype))
    try:
        trainer.actor_engine(input_ids=torch.tensor([[5, 6, 7]], device=trainer.device))
    finally:
        hook.remove()
    assert dtypes == [torch.bfloat16 if bf16 else torch.float32]
    assert next(trainer.actor_module.parameters()).dtype == torch.float32


def test_full_fine_tuning_reference_is_a_bf16_copy_under_bf16(tiny_model_dir, critic_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = make_settings(mini_batch_size=2, micro_batch_size=2, lora=False)
    for bf16, dtype in ((True, torch.bfloat16), (False, torch.float32)):
        trainer = PPOTrainer(tiny_model_dir, critic_dir, replace(base, bf16=bf16), GAE, tokenizer)
        ref = trainer.models.ref
        assert ref is not None and {p.dtype for p in ref.parameters()} == {dtype}
        assert not any(p.requires_grad for p in ref.parameters())
    lora = PPOTrainer(tiny_model_dir, critic_dir, replace(base, lora=True), GAE, tokenizer)
    assert lora.models.ref is None  # the actor with adapters disabled: no copy at all
