"""Params → the objects the stages run: trainer settings, GAE and group parameters, the
collector the protocol and estimator need, the critic dir it reads, how a batch is scored,
written and summarised, Parquet metadata.

The only place a params section is mapped onto library objects, so the train loop, the critic
warm-up and the benches build them the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from longturn.algo.gae import GAEParams
from longturn.algo.trainer import PPOTrainer, TrainerSettings
from longturn.params.config import Params
from longturn.params.estimator import Collection
from longturn.device import resolve_bf16, resolve_device
from longturn.distributed import sum_over_ranks
from longturn.rollout.conversation_player import conversation_episodes, conversation_fixed_turns
from longturn.rollout.sample_metrics import sample_metrics
from longturn.run.metrics import logprob_gap
from longturn.run.protocol import protocol
from longturn.trajectories import write_samples

if TYPE_CHECKING:  # the agent's endpoint needs aiohttp, imported only when an agent plays
    from longturn.rollout.collection import EpisodeGroups, FixedTurnBatches
    from longturn.serve.agent_turns import AgentTurnCollector

    # what the train loop collects with
    Collector = FixedTurnBatches | EpisodeGroups | AgentTurnCollector


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
        device=params.engine.device, seed=params.seed, estimator=params.algo.estimator,
        group_norm_std=params.algo.norm_std, step_weight=params.algo.step_weight,
        whiten_advantages=True, weight_decay=0.0)  # the trainer's own choices, not params.yaml's


def gae_params(params: Params) -> GAEParams:
    """The dual discount of the gae section."""
    g = params.gae
    return GAEParams(g.gamma_step, g.lambda_step, g.gamma_token, g.lambda_token)


def make_collector(params: Params, rank: int, run_id: str) -> Collector:
    """The protocol's episodes (run/protocol.py) collected as the estimator says: fixed-turn
    batches whose episodes continue across updates (a critic; an agent's calls with one), groups
    of whole episodes from one seed (critic-free), or whole episodes (a critic, a rollout that
    cannot be cut)."""
    r, tasks, collection = params.rollout, list(params.env.tasks), params.collection
    run = protocol(params).conversation_run(params)
    if collection is Collection.FIXED_TURNS and r.agent is not None:  # an agent's calls
        from longturn.serve.agent_turns import AgentTurnCollector

        return AgentTurnCollector.from_params(params, run, rank, run_id)
    if collection is Collection.FIXED_TURNS:  # the built-in rollout with a window, or an env's
        return conversation_fixed_turns(run, tasks, r.n_envs, r.turns_per_env, params.seed,
                                        rank=rank, run_id=run_id)
    group = params.algo.group_size if collection is Collection.SEED_GROUPS else None
    return conversation_episodes(run, tasks, r.n_envs, group, params.seed, rank=rank,
                                 run_id=run_id)


def critic_dir(params: Params, warm: Path) -> Path | None:
    """The warm critic dir the estimator trains on, or None when it needs none."""
    return warm if params.algo.estimator.has_critic else None


def file_metadata(params: Params, iteration: int) -> dict[str, Any]:
    """What a training Parquet file records about how its columns were computed."""
    return {**params.gae.model_dump(), "algo": params.algo.model_dump(),
            "model": params.model.source, "engine": params.engine.name, "iteration": iteration,
            "sampling": params.engine.sampling.model_dump(), "ppo": params.ppo.model_dump()}


def score_and_write(trainer: PPOTrainer, samples: list[dict[str, Any]], path: Path,
                    metadata: dict[str, Any]) -> Path:
    """Fill a batch's training columns and write it as the update's Parquet part."""
    trainer.score(samples)
    return write_samples(samples, path, metadata)


def batch_metrics(samples: list[dict[str, Any]], collector: Collector) -> dict[str, float]:
    """What a collected batch's samples say over every rank (its actions named by the
    collector), and the engine's logprob gap from the scored samples."""
    metrics = sample_metrics(samples, collector.action_names(), sum_over_ranks)
    metrics.update(logprob_gap(samples, sum_over_ranks))
    return metrics
