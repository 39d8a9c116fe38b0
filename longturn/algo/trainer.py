"""PPOTrainer: actor + critic as two DeepSpeed engines, updated from turn Parquet files.

With a critic-free estimator (`advantage: grpo | gigpo`) there is no critic at all: no model, no
engine, no value loss; the actor alone is scored, updated and checkpointed.

`score(rows)` fills the training columns after a rollout; `update(paths)` reads those columns
back from Parquet (the file is the only hand-off, so any iteration can be replayed) and runs
`ppo_epochs` passes of shuffled mini-batches, each one optimizer step per engine
(algo/ppo_steps.py).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import shutil
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM

from longturn.algo.batches import read_sample_batch
from longturn.algo.critic import ValueModel
from longturn.algo.gae import GAEParams
from longturn.params.estimator import Estimator
from longturn.algo.group_advantages import GroupParams
from longturn.algo.lora import apply_lora, merge_and_save, merged_state_dict
from longturn.algo.model_set import ModelSet
from longturn.algo.ppo_steps import UpdateStats, batch_stats, minibatch_step, schedule
from longturn.algo.rng_state import load_rng_states, save_rng_states
from longturn.algo.sample_scoring import score_samples
from longturn.atomic import atomic_dir
from longturn.device import resolve_device
from longturn.distributed import (all_reduce_tensor, barrier, init_distributed, is_main_process,
                                  sum_over_ranks)
from longturn.vision.encoder import VISION_DIR, load_vision

log = logging.getLogger(__name__)
_TAG = "state"  # fixed DeepSpeed tag: saving into the same dir again replaces the checkpoint
BUCKET = 50_000_000  # elements per ZeRO reduce / all-gather bucket


@dataclass
class TrainerSettings:
    """PPO hyper-parameters; batch sizes count turns per rank.

    No defaults of its own for what params.yaml sets: `wiring.trainer_settings` builds it from the
    pydantic sections (ppo, algo, engine, seed), the one place defaults live."""

    actor_lr: float
    critic_lr: float
    clip_ratio: float
    value_clip: float | None
    first_token_weight: float
    entropy_coef: float
    kl_beta: float
    kl_estimator: str
    temperature: float  # the sampling temperature: π = softmax(logits / T)
    ppo_epochs: int
    mini_batch_size: int
    micro_batch_size: int
    grad_clip: float
    zero_stage: int
    bf16: bool  # bf16 autocast for forward/backward; master weights stay fp32
    lora: bool
    lora_r: int
    lora_alpha: float
    lora_layers: int | None  # adapters on the top N transformer layers only (None: all)
    share_prefix: bool  # run the prompts' common prefix once per micro-batch
    share_trunk: bool  # run the frozen layers actor, reference and critic share once
    gradient_checkpointing: bool
    target_kl: float | None  # CleanRL: no further epochs once approx_kl exceeds it
    device: str  # engine.device: auto | cpu | cuda
    seed: int
    estimator: Estimator  # algo.advantage: gae (with a critic) | grpo | gigpo (critic-free)
    group_norm_std: bool  # critic-free: divide by the group's std
    step_weight: float  # gigpo: weight of the anchor-state advantage
    whiten_advantages: bool  # not a params.yaml setting: `wiring.trainer_settings` fixes it
    weight_decay: float  # likewise

    @property
    def has_critic(self) -> bool:
        return self.estimator.has_critic

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1 or self.mini_batch_size < self.micro_batch_size:
            raise ValueError("need 1 <= micro_batch_size <= mini_batch_size")
        if self.mini_batch_size % self.micro_batch_size:
            raise ValueError(f"mini_batch_size {self.mini_batch_size} must be a multiple of "
                             f"micro_batch_size {self.micro_batch_size}")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0")
        if self.kl_estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"kl_estimator must be k1, k2 or k3, got {self.kl_estimator!r}")


def ds_config(settings: TrainerSettings) -> dict[str, Any]:
    """DeepSpeed config of one engine: fp32 master weights, and with `bf16` torch's bf16 autocast
    declared in DeepSpeed's own `torch_autocast` section. Without that section DeepSpeed turns an
    outer autocast OFF inside its engine on CUDA ("enabled outside DeepSpeed but disabled within"),
    and the update would run in fp32 while scoring ran in bf16. No module is listed as safe for
    lower-precision gradient communication, so gradients are reduced in fp32. ZeRO's reduce and
    all-gather buckets hold 50M elements instead of DeepSpeed's 500M: the default is 2 GB of fp32
    per engine, memory a GPU shared with an inference server does not have to spare."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": settings.micro_batch_size,
        "gradient_accumulation_steps": settings.mini_batch_size // settings.micro_batch_size,
        "gradient_clipping": settings.grad_clip,
        "zero_optimization": {"stage": settings.zero_stage, "reduce_bucket_size": BUCKET,
                              "allgather_bucket_size": BUCKET},
        "zero_allow_untested_optimizer": True,
        "fp16": {"enabled": False},
        "bf16": {"enabled": False},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if settings.bf16:
        config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16",
                                    "lower_precision_safe_modules": []}
    return config


def _engine(model: torch.nn.Module, lr: float, settings: TrainerSettings) -> Any:
    """Wrap a model in a DeepSpeed engine with a torch AdamW (no op compiles) on its trainables."""
    import deepspeed

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=settings.weight_decay)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(settings))
    return engine


class PPOTrainer:
    """Owns the actor, critic and reference models and their optimizers on this rank."""

    def __init__(self, actor_dir: str | Path, critic_dir: str | Path | None,
                 settings: TrainerSettings, gae_params: GAEParams, tokenizer: Any,
                 progress: bool = False) -> None:
        """``progress`` shows bars for scoring and the update (on rank 0 only); ``critic_dir`` is
        read only when the estimator needs a critic."""
        self.settings, self.gae_params, self.tokenizer = settings, gae_params, tokenizer
        self.device = resolve_device(settings.device)
        self.rank, self.world_size = init_distributed(self.device)
        self.progress = progress and self.rank == 0
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad or 0)
        self.updates = 0
        torch.manual_seed(settings.seed)  # LoRA / value-head init is the same on every rank
        actor = AutoModelForCausalLM.from_pretrained(str(actor_dir), dtype=torch.float32)
        critic = None
        if settings.has_critic:
            if critic_dir is None:
                raise ValueError(f"advantage {settings.estimator.name!r} needs a critic: pass "
                                 "its dir")
            critic = ValueModel.from_pretrained(critic_dir)
        ref: torch.nn.Module | None = None  # LoRA: the actor with its adapters disabled
        if settings.lora:
            actor = apply_lora(actor, settings.lora_r, settings.lora_alpha,
                               top_layers=settings.lora_layers)
            if critic is not None:
                critic = apply_lora(critic, settings.lora_r, settings.lora_alpha,
                                    top_layers=settings.lora_layers)
        else:  # a frozen copy, made on the CPU (before DeepSpeed moves the actor) and in bf16
            # under bf16: the reference never exists in fp32 on the GPU
            ref = copy.deepcopy(actor).to(torch.bfloat16 if settings.bf16 else torch.float32)
            ref.eval().requires_grad_(False)
        self.actor_engine = _engine(actor, settings.actor_lr, settings)
        self.critic_engine = None if critic is None else _engine(critic, settings.critic_lr,
                                                                 settings)
        self.engines = [e for e in (self.actor_engine, self.critic_engine) if e is not None]
        if ref is not None:  # DeepSpeed moved the actor to its device; the ref follows
            ref.to(self.actor_engine.device)
        vision = load_vision(actor_dir, self.actor_engine.device)
        self.vision_dir = None if vision is None else Path(actor_dir) / VISION_DIR
        self.models = ModelSet(self.actor_engine.module, ref,
                               None if self.critic_engine is None else self.critic_engine.module,
                               settings.share_trunk, settings.gradient_checkpointing, vision,
                               keep_trunk_rows=settings.zero_stage < 3)
        decoder = self.models.actor_decoder
        log.info("trainer on %s, bf16 autocast %s, advantage %s: %d of %d layers shared by %s",
                 self.actor_engine.device, "on" if settings.bf16 else "off",
                 settings.estimator.name, self.models.depth,
                 len(decoder.layers) if decoder is not None else 0,
                 "actor, reference and critic" if critic is not None else "actor and reference")

    @property
    def actor_module(self) -> torch.nn.Module:
        """The trained actor (a peft model under LoRA), e.g. to push weights to an engine."""
        return self.actor_engine.module

    @property
    def critic_module(self) -> ValueModel:
        if self.critic_engine is None:
            raise ValueError(f"advantage {self.settings.estimator.name!r} trains no critic")
        return self.critic_engine.module

    def score(self, samples: list[dict[str, Any]],
              reuse_logprobs: bool = False) -> list[dict[str, Any]]:
        """Fill the training columns of this rank's samples in place (algo/sample_scoring.py);
        ``reuse_logprobs``: keep the old/ref logprobs they carry."""
        for engine in self.engines:
            engine.eval()
        s, gae, group = self.settings, self.gae_params, None
        if not s.has_critic:  # a critic-free estimator, whose discount is gae.gamma_step
            gae, group = None, GroupParams(estimator=s.estimator.name,
                                           gamma_step=self.gae_params.gamma_step,
                                           norm_std=s.group_norm_std, step_weight=s.step_weight)
        return score_samples(samples, self.models, s, gae, group, self.pad_id, reuse_logprobs,
                             self.progress)

    def update(self, parquet_paths: list[str], train_actor: bool = True) -> dict[str, float]:
        """One PPO update from this rank's sample files (docs/design.md §4); scalars averaged
        over ranks.

        `train_actor=False` updates the critic only (critic warm-up: the actor never moves).

        Losses, clip fraction, approx KL, entropy and grad norms are of the update itself; KL
        think/action, explained variance and the value/advantage/return means describe the batch
        as scored. tokens_per_s counts prompt + response tokens trained on, per epoch, per second.
        """
        start = time.perf_counter()
        s = self.settings
        if not train_actor and self.critic_engine is None:
            raise ValueError("a critic-only update needs a critic")
        # group advantages are already normalised within their groups: whitening them again over
        # the batch's tokens would shift every one by a token-weighted mean (longer turns count
        # more) and undo the group baseline
        batch = read_sample_batch(parquet_paths, whiten=s.whiten_advantages and s.has_critic,
                                values=s.has_critic)
        played = len(batch)
        batch = batch.padded_to(self._largest_rank(played))
        stats = UpdateStats()
        for engine in self.engines:
            engine.train()
        rng = np.random.default_rng([s.seed, self.updates])
        steps = s.ppo_epochs * math.ceil(len(batch) / s.mini_batch_size)
        bar = tqdm(total=steps, desc="update", unit="mini-batch", disable=not self.progress,
                   leave=False)
        lengths = [len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)]
        epochs = 0
        for _ in range(s.ppo_epochs):
            epoch_stats = UpdateStats()
            for mini, micros in schedule(len(batch), s.mini_batch_size, s.micro_batch_size, rng,
                                         lengths):
                minibatch_step(self.models, self.actor_engine, self.critic_engine, batch, mini,
                               micros, s, self.pad_id, epoch_stats, train_actor)
                bar.update(1)
            stats.merge(epoch_stats)
            epochs += 1
            if train_actor and self._kl_exceeded(epoch_stats):
                break
        bar.close()
        self.updates += 1
        seconds = time.perf_counter() - start
        tokens = epochs * sum(lengths)
        metrics = stats.summary()
        metrics.update(batch_stats(batch, self.tokenizer), n_turns=float(played))
        metrics.update(seconds=seconds, tokens_per_s=tokens / max(seconds, 1e-9),
                       epochs_run=float(epochs), lr_actor=_learning_rate(self.actor_engine))
        if self.critic_engine is not None:
            metrics["lr_critic"] = _learning_rate(self.critic_engine)
        log.debug("update %d on rank %d: %s", self.updates, self.rank, metrics)
        return self._mean_over_ranks(metrics)

    def _kl_exceeded(self, epoch_stats: UpdateStats) -> bool:
        """CleanRL's early stop: this epoch's approx_kl (mean over ranks) above ppo.target_kl."""
        target = self.settings.target_kl
        if target is None:
            return False
        local = epoch_stats.summary().get("approx_kl", 0.0)
        mean = float(sum_over_ranks(np.array([local]))[0]) / self.world_size
        if mean > target:
            log.info("approx_kl %.4f > target_kl %.4f: no further PPO epochs this update",
                     mean, target)
        return mean > target

    def _largest_rank(self, n: int) -> int:
        """The most samples any rank holds (`TurnBatch.padded_to` evens the ranks out)."""
        if self.world_size == 1:
            return n
        return int(all_reduce_tensor(torch.tensor([n], dtype=torch.int64), dist.ReduceOp.MAX)[0])

    def _mean_over_ranks(self, metrics: dict[str, float]) -> dict[str, float]:
        if self.world_size == 1:
            return metrics
        keys = sorted(metrics)
        values = all_reduce_tensor(torch.tensor([metrics[k] for k in keys], dtype=torch.float64))
        return {k: float(v) / self.world_size for k, v in zip(keys, values.tolist())}

    def weights_digest(self) -> str:
        """sha256 over actor and critic parameters (names and bytes, fixed order): equal on every
        rank after an update, which checkpoints record so runs can be audited. Under ZeRO-3 each
        rank holds only its partition, so digests differ by design there."""
        digest = hashlib.sha256()
        for engine in self.engines:
            for name, param in sorted(engine.module.named_parameters(), key=lambda kv: kv[0]):
                digest.update(name.encode())
                digest.update(param.detach().float().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()

    def save_checkpoint(self, directory: str | Path, client_state: dict[str, Any] | None = None) -> None:
        """Both engines (weights + optimizer) under dir/actor, dir/critic, plus per-rank RNG."""
        out = Path(directory)
        state = {"longturn_user": dict(client_state or {}), "longturn_updates": self.updates}
        self.actor_engine.save_checkpoint(str(out / "actor"), tag=_TAG, client_state=state)
        if self.critic_engine is not None:
            self.critic_engine.save_checkpoint(str(out / "critic"), tag=_TAG)
        save_rng_states(out / f"rng_rank{self.rank}.pt")
        barrier()

    def load_checkpoint(self, directory: str | Path) -> dict[str, Any]:
        """Restore what save_checkpoint wrote; returns the caller's client_state."""
        src = Path(directory)
        path, state = self.actor_engine.load_checkpoint(str(src / "actor"), tag=_TAG)
        critic_path = "none needed"
        if self.critic_engine is not None:
            critic_path, _ = self.critic_engine.load_checkpoint(str(src / "critic"), tag=_TAG)
        if path is None or critic_path is None:
            raise FileNotFoundError(f"no complete trainer checkpoint under {src}")
        self.updates = int(state.get("longturn_updates", 0))
        self.models.forget_prefixes()
        load_rng_states(src / f"rng_rank{self.rank}.pt")
        return dict(state.get("longturn_user", {}))

    def actor_weights(self) -> dict[str, torch.Tensor]:
        """The actor as a plain HF state dict (LoRA merged), on the trainer's device: what an
        in-process engine loads in memory instead of a save-and-reload through disk."""
        with torch.no_grad():
            return merged_state_dict(self.actor_module)

    def export_actor(self, out_dir: str | Path) -> Path:
        """A plain HF dir (LoRA merged, tokenizer included) that inference engines load; written
        under a temp name and renamed, so a kill mid-export leaves no dir that looks like a
        model."""
        with _gathered(self.actor_module, self.settings.zero_stage):  # collective under ZeRO-3
            if is_main_process():
                with atomic_dir(out_dir) as tmp:
                    merge_and_save(self.actor_module, tmp, self.tokenizer)
                    if self.vision_dir is not None:  # frozen: the same image side goes along
                        shutil.copytree(self.vision_dir, tmp / VISION_DIR)
        barrier()
        return Path(out_dir)

    def export_critic(self, out_dir: str | Path) -> Path:
        """A critic dir (backbone + value_head.safetensors) that ValueModel.from_pretrained loads;
        atomic like export_actor."""
        with _gathered(self.critic_module, self.settings.zero_stage):
            if is_main_process():
                with atomic_dir(out_dir) as tmp:
                    self.critic_module.save_pretrained(tmp, self.tokenizer)
        barrier()
        return Path(out_dir)


def _learning_rate(engine: Any) -> float:
    return float(engine.optimizer.param_groups[0]["lr"])


def _gathered(module: torch.nn.Module, zero_stage: int) -> Any:
    """Full parameters for saving: ZeRO-3 partitions them, lower stages keep them whole."""
    if zero_stage < 3:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
