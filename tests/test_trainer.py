"""PPOTrainer in one process: an update moves the weights (only LoRA adapters under LoRA), metrics
are complete and finite, gradient accumulation gives the mini-batch token mean, a checkpoint
resumes bit-for-bit, and exports load with plain transformers."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from longturn.algo.critic import ValueModel
from longturn.algo.gae import GAEParams
from longturn.algo.trainer import PPOTrainer
from turn_rows import samples_from_turns
from reference_forward import random_head_critic, response_values
from longturn.trajectories import write_samples
from trainer_settings import make_settings
from two_rank_update import make_rows

GAE = GAEParams(gamma_step=0.99, lambda_step=0.95)
SETTINGS = make_settings(actor_lr=1e-3, critic_lr=1e-3, mini_batch_size=4, micro_batch_size=2,
                         temperature=0.7, kl_beta=0.01, entropy_coef=0.01, seed=5)
KEYS = {"policy_loss", "value_loss", "clip_fraction", "approx_kl", "entropy",
        "explained_variance", "kl_think", "kl_action", "kl_mean", "grad_norm_actor",
        "grad_norm_critic", "tokens_per_s", "seconds", "value_mean", "advantage_mean",
        "return_mean", "return_variance"}
TIMING = {"seconds", "tokens_per_s"}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: str):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def critic_dir(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A critic with a non-zero head, so values and explained variance are not trivial."""
    torch.manual_seed(3)
    out = tmp_path_factory.mktemp("critic")
    random_head_critic(tiny_model_dir, 0.3).save_pretrained(out)
    return str(out)


def _trainer(model_dir: str, critic_dir: str, tokenizer, **changes) -> PPOTrainer:
    return PPOTrainer(model_dir, critic_dir, replace(SETTINGS, **changes), GAE, tokenizer)


def _batch(trainer: PPOTrainer, seed: int, path: Path) -> str:
    samples = trainer.score(samples_from_turns(make_rows(seed, trainer.tokenizer, n_slots=3,
                                                         n_steps=3)))
    return str(write_samples(samples, path))


def _params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def _changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> set[str]:
    return {k for k, v in module.named_parameters() if not torch.equal(before[k], v.detach())}


def test_update_moves_weights_and_reports_finite_metrics(tiny_model_dir, critic_dir, tokenizer,
                                                         tmp_path) -> None:
    trainer = _trainer(tiny_model_dir, critic_dir, tokenizer)
    path = _batch(trainer, 1, tmp_path / "b.parquet")
    actor, critic = _params(trainer.actor_module), _params(trainer.critic_module)
    metrics = trainer.update([path])
    assert KEYS <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["grad_norm_actor"] > 0 and metrics["grad_norm_critic"] > 0
    assert _changed(actor, trainer.actor_module) and _changed(critic, trainer.critic_module)
    ref = trainer.models.ref
    assert ref is not None and all(
        torch.equal(actor[k], v) for k, v in ref.named_parameters())  # ref stays frozen


def test_lora_update_changes_only_adapters(tiny_model_dir, critic_dir, tokenizer, tmp_path) -> None:
    trainer = _trainer(tiny_model_dir, critic_dir, tokenizer, lora=True, lora_r=4)
    path = _batch(trainer, 1, tmp_path / "b.parquet")
    actor, critic = _params(trainer.actor_module), _params(trainer.critic_module)
    metrics = trainer.update([path])
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    moved_actor = _changed(actor, trainer.actor_module)
    moved_critic = _changed(critic, trainer.critic_module)
    assert moved_actor and all("lora_" in k for k in moved_actor)
    assert moved_critic and all("lora_" in k or k.startswith("value_head") for k in moved_critic)
    # export merges the adapters: plain transformers gives the trained policy's logits
    out = trainer.export_actor(tmp_path / "actor")
    plain = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([[5, 17, 99, 3, 41, 8]])
    with torch.no_grad():  # the trainer's device may be a GPU, the exported model loads on CPU
        expected = trainer.actor_module(input_ids=ids.to(trainer.device)).logits.cpu()
        torch.testing.assert_close(plain(input_ids=ids).logits, expected, atol=1e-4, rtol=1e-4)


def test_accumulation_gives_the_mini_batch_mean(tiny_model_dir, critic_dir, tokenizer,
                                                tmp_path) -> None:
    """One micro-batch per mini-batch, four, or four under ZeRO-2: same losses and grad norms."""
    results = []
    for changes in ({"micro_batch_size": 4}, {"micro_batch_size": 1},
                    {"micro_batch_size": 1, "zero_stage": 2}):
        trainer = _trainer(tiny_model_dir, critic_dir, tokenizer, entropy_coef=0.0, **changes)
        path = tmp_path / "b.parquet"
        if not path.exists():
            _batch(trainer, 2, path)
        metrics = trainer.update([str(path)])
        results.append((metrics, _params(trainer.actor_module)))
    base, base_params = results[0]
    for metrics, params in results[1:]:
        for key in ("policy_loss", "value_loss", "grad_norm_actor", "grad_norm_critic"):
            assert metrics[key] == pytest.approx(base[key], rel=1e-4, abs=1e-6), key
        # Adam's step is lr·m/√v: for a near-zero gradient a last-bit change in the summation
        # order moves it by a sizeable part of lr (1e-3), so weights get a looser bound than the
        # losses and norms above (a wrong accumulation scale shows in those, not here).
        for name, value in params.items():
            torch.testing.assert_close(value, base_params[name], atol=5e-5, rtol=1e-4)


def _draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_checkpoint_resume_is_deterministic(tiny_model_dir, critic_dir, tokenizer,
                                            tmp_path) -> None:
    first = _trainer(tiny_model_dir, critic_dir, tokenizer)
    first.update([_batch(first, 1, tmp_path / "b1.parquet")])
    first.save_checkpoint(tmp_path / "ckpt", {"iteration": 7, "note": "x"})
    draws = _draws()
    second_batch = _batch(first, 2, tmp_path / "b2.parquet")  # scored by the updated policy
    expected = first.update([second_batch])
    assert expected["kl_action"] != 0 and expected["kl_think"] != 0  # actor has left the ref

    torch.manual_seed(123)  # the checkpoint, not the current process state, decides what follows
    resumed = _trainer(tiny_model_dir, critic_dir, tokenizer)
    assert resumed.load_checkpoint(tmp_path / "ckpt") == {"iteration": 7, "note": "x"}
    assert _draws() == draws
    metrics = resumed.update([second_batch])
    assert {k: v for k, v in metrics.items() if k not in TIMING} == pytest.approx(
        {k: v for k, v in expected.items() if k not in TIMING}, rel=1e-6, abs=1e-7)
    for name, value in resumed.actor_module.named_parameters():
        torch.testing.assert_close(value, dict(first.actor_module.named_parameters())[name],
                                   atol=1e-7, rtol=1e-6)


def test_export_critic_round_trip(tiny_model_dir, critic_dir, tokenizer, tmp_path) -> None:
    trainer = _trainer(tiny_model_dir, critic_dir, tokenizer)
    trainer.update([_batch(trainer, 3, tmp_path / "b.parquet")])
    out = trainer.export_critic(tmp_path / "critic")
    loaded = ValueModel.from_pretrained(out).eval()
    prompts, responses = [[5, 6, 7], [8, 9]], [[10, 11], [12]]
    with torch.no_grad():
        expected, _ = response_values(trainer.critic_module, prompts, responses, 2)
        got, _ = response_values(loaded, prompts, responses, 2)
    torch.testing.assert_close(got, expected.cpu(), atol=1e-5, rtol=1e-5)
    actor_out = trainer.export_actor(tmp_path / "actor")
    assert AutoModelForCausalLM.from_pretrained(actor_out) is not None
    assert (Path(actor_out) / "tokenizer.json").is_file()


def test_updates_raise_the_rewarded_response_and_lower_the_penalised_one(
        tiny_model_dir, tokenizer, tmp_path) -> None:
    """The RL loop's direction, end to end through scoring, GAE, Parquet and the PPO step: one-turn
    episodes from one prompt, response A rewarded +1 and B -1; after a few updates A is likelier
    and B less likely than before. A sign error anywhere in the chain fails this.

    The critic starts at V ≡ 0 (zero head, as warm-up starts), so every token's advantage has its
    reward's sign; a random head would add per-token noise as large as the rewards."""
    zero_critic = tmp_path / "critic"
    ValueModel.from_pretrained(tiny_model_dir).save_pretrained(zero_critic)
    trainer = _trainer(tiny_model_dir, str(zero_critic), tokenizer, actor_lr=3e-3, kl_beta=0.0,
                       entropy_coef=0.0)
    prompt = tokenizer.encode("You see a wall. Goal: go to the ball.", add_special_tokens=False)
    good = tokenizer.encode(" THINK: turn. ACTION: turn left", add_special_tokens=False)
    bad = tokenizer.encode(" THINK: wait. ACTION: pick up", add_special_tokens=False)

    def rows() -> list[dict]:
        return samples_from_turns([
            {"iteration": 0, "env_index": i, "step": 0, "turn": 0, "episode_id": f"e{i}",
             "episode_seed": i, "prompt_ids": prompt, "response_ids": good if i % 2 else bad,
             "reward": 1.0 if i % 2 else -1.0, "terminated": True, "truncated": False,
             "segment_end": True, "aborted": False} for i in range(4)])

    def logprob_sums() -> tuple[float, float]:
        scored = trainer.score(rows()[:2])
        return sum(scored[1]["old_logprobs"]), sum(scored[0]["old_logprobs"])

    good_before, bad_before = logprob_sums()
    for step in range(3):
        trainer.update([str(write_samples(trainer.score(rows()), tmp_path / f"b{step}.parquet"))])
    good_after, bad_after = logprob_sums()
    assert good_after > good_before + 0.1 and bad_after < bad_before - 0.1


def test_target_kl_stops_the_epochs_and_lr_is_reported(tiny_model_dir, critic_dir, tokenizer,
                                                       tmp_path) -> None:
    """CleanRL's rule: after an epoch whose approx_kl exceeds target_kl, no further epoch."""
    path = None
    runs = {}
    for target in (None, 1e-9):
        trainer = _trainer(tiny_model_dir, critic_dir, tokenizer, ppo_epochs=3, target_kl=target)
        path = path or _batch(trainer, 3, tmp_path / "b.parquet")
        runs[target] = trainer.update([path])
    assert runs[None]["epochs_run"] == 3 and runs[1e-9]["epochs_run"] == 1
    assert runs[1e-9]["approx_kl"] > 1e-9  # the later mini-batches saw a moved policy
    assert runs[None]["lr_actor"] == SETTINGS.actor_lr and runs[None]["lr_critic"] == SETTINGS.critic_lr
