"""Params → the objects the stages run: trainer settings, GAE and group parameters, the
collector the estimator needs, the critic dir it reads, Parquet metadata, the resume fingerprint.

The only place a params section is mapped onto library objects, so the train loop, the critic
warm-up and the benches build them the same way.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from longturn.algo.gae import GAEParams
from longturn.algo.group_advantages import needs_critic
from longturn.algo.trainer import TrainerSettings
from longturn.collector import FixedTurnCollector
from longturn.config import Params
from longturn.device import resolve_bf16, resolve_device
from longturn.group_collector import EpisodeGroupCollector
from longturn.rollout import AgentSettings, env_factory_from_params

Collector = FixedTurnCollector | EpisodeGroupCollector  # what the train loop collects with


def trainer_settings(params: Params) -> TrainerSettings:
    """The trainer's settings from the ppo, algo, engine and seed sections."""
    p = params.ppo
    return TrainerSettings(
        actor_lr=p.actor_lr, critic_lr=p.critic_lr, clip_ratio=p.clip_ratio,
        value_clip=p.value_clip, first_token_weight=p.first_token_weight,
        entropy_coef=p.entropy_coef, kl_beta=p.kl_beta, kl_estimator=p.kl_estimator,
        temperature=params.engine.sampling.temperature or 1.0, ppo_epochs=p.ppo_epochs,
        mini_batch_size=p.mini_batch_size, micro_batch_size=p.micro_batch_size,
        grad_clip=p.grad_clip, zero_stage=p.zero_stage,
        bf16=resolve_bf16(p.bf16, resolve_device(params.engine.device)), lora=p.lora,
        lora_r=p.lora_r, lora_alpha=p.lora_alpha, lora_layers=p.lora_layers,
        share_prefix=p.share_prefix, share_trunk=p.share_trunk,
        gradient_checkpointing=p.gradient_checkpointing, target_kl=p.target_kl,
        device=params.engine.device, seed=params.seed, advantage=params.algo.advantage,
        group_norm_std=params.algo.norm_std, step_weight=params.algo.step_weight)


def gae_params(params: Params) -> GAEParams:
    """The dual discount of the gae section."""
    g = params.gae
    return GAEParams(g.gamma_step, g.lambda_step, g.gamma_token, g.lambda_token)


def make_collector(params: Params, rank: int, run_id: str) -> Collector:
    """Fixed-turn batches for GAE; whole episodes in groups for a critic-free estimator."""
    r, tasks, agent = params.rollout, list(params.env.tasks), AgentSettings.from_params(params)
    if not needs_critic(params.algo.advantage):
        return EpisodeGroupCollector(env_factory_from_params(params), tasks, r.n_envs,
                                     params.algo.group_size, agent, params.seed, rank=rank,
                                     run_id=run_id)
    return FixedTurnCollector(env_factory_from_params(params), tasks, r.n_envs,
                              r.turns_per_env, agent, params.seed, rank=rank, run_id=run_id)


def critic_dir(params: Params, warm: Path) -> Path | None:
    """The warm critic dir the estimator trains on, or None when it needs none."""
    return warm if needs_critic(params.algo.advantage) else None


def file_metadata(params: Params, iteration: int) -> dict[str, Any]:
    """What a training Parquet file records about how its columns were computed."""
    return {**params.gae.model_dump(), "algo": params.algo.model_dump(),
            "model": params.model.source, "engine": params.engine.name, "iteration": iteration,
            "sampling": params.engine.sampling.model_dump(), "ppo": params.ppo.model_dump()}


def run_fingerprint(params: Params) -> str:
    """What a resumed run must share with the run that wrote the checkpoints (not train.*)."""
    relevant = params.model_dump(include={"seed", "model", "env", "prompt", "engine", "rollout",
                                          "gae", "algo", "ppo"})
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]
