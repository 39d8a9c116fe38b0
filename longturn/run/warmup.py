"""Critic warm-up: fit the value model to the frozen base policy before the actor moves.

Collect `warmup.batches` fixed-turn batches with the base actor, then `warmup.iterations` times:
re-score the turns with the current critic (values, bootstrap values and GAE targets change as it
learns), sample `warmup.sample_fraction` of them and update the critic alone. A value loss that has
not come down is reported, or is an error when `warmup.max_final_loss` is set: then no critic is
written (a previous one is removed first), so nothing downstream can take it for a warm critic.
A critic-free estimator (`algo.advantage: grpo | gigpo`) has no critic to warm: the stage writes a
short note in place of the model and nothing else.
"""

from __future__ import annotations

import logging
import math
import shutil
from contextlib import closing
from pathlib import Path

import numpy as np

from longturn.algo.trainer import PPOTrainer
from longturn.atomic import atomic_dir
from longturn.params.config import Params
from longturn.device import resolve_device
from longturn.distributed import init_distributed, is_main_process
from longturn.engines.registry import make_engine, sampling_from_params
from longturn.errors import UserError
from longturn.run.metrics import MetricsLog
from longturn.run.models import load_tokenizer
from longturn.trajectories import write_samples
from longturn.run.checkpoints import iteration_dir
from longturn.run.wiring import file_metadata, gae_params, make_collector, trainer_settings

log = logging.getLogger(__name__)


class WarmupDidNotConverge(UserError):
    """The critic's final loss is above `warmup.max_final_loss`."""


def collect_frozen(params: Params, base: Path, rank: int, progress: bool) -> list[dict]:
    """warmup.batches batches of samples from the base policy, collected as training would."""
    tokenizer = load_tokenizer(base)
    sampling = sampling_from_params(params, seed=params.seed + 7919)
    samples: list[dict] = []
    # both closed on any exit: a failed batch must not leave env workers or the engine up
    with (closing(make_engine(str(base), params)) as engine,
          closing(make_collector(params, rank, "warmup")) as collector):
        for batch in range(params.warmup.batches):
            samples += collector.collect(engine, tokenizer, sampling, batch,
                                         {"run_id": "warmup", "policy_version": "base"}, progress)
    return samples


def run_critic_warmup(params: Params, base: Path, out: Path, live_dir: Path, work_dir: Path,
                      progress: bool = True) -> dict[str, float]:
    """Warm the critic; writes it to `out` and returns summary metrics."""
    rank, _ = init_distributed(resolve_device(params.engine.device))
    if is_main_process():  # this run replaces it: a failure must not leave the old one looking new
        shutil.rmtree(out, ignore_errors=True)
    if not params.algo.estimator.has_critic:
        return write_no_critic_note(params, out, work_dir, live_dir)
    samples = collect_frozen(params, base, rank, progress)
    trainer = PPOTrainer(base, base, trainer_settings(params), gae_params(params),
                         load_tokenizer(base), progress=progress)
    w = params.warmup
    rng = np.random.default_rng(params.seed)
    size = max(1, math.ceil(w.sample_fraction * len(samples)))
    live = MetricsLog(live_dir, [], namespace="warmup")
    losses = []
    for it in range(w.iterations):
        picked = sorted(rng.choice(len(samples), size=size, replace=False))
        part = iteration_dir(work_dir, it) / f"part-{rank:02d}.parquet"
        # the actor is frozen: logprobs stay, only values and advantages change; every sample
        # is scored (a picked turn's successor is needed for its next_value), the picked written
        trainer.score(samples, reuse_logprobs=it > 0)
        write_samples([samples[i] for i in picked], part, file_metadata(params, it))
        metrics = trainer.update([str(part)], train_actor=False)
        losses.append(metrics["value_loss"])
        live.log({key: metrics[key] for key in ("value_loss", "explained_variance",
                                                "return_variance") if key in metrics})
        log.info("warm-up %d/%d: value loss %.5f", it + 1, w.iterations, metrics["value_loss"])
    _check(losses, w.max_final_loss)  # the gate, before anything is exported
    trainer.export_critic(out)
    return {"first_value_loss": losses[0], "final_value_loss": losses[-1],
            "turns": float(len(samples)), "iterations": float(w.iterations)}


NO_CRITIC = "NO_CRITIC.md"


def write_no_critic_note(params: Params, out: Path, work_dir: Path,
                         live_dir: Path) -> dict[str, float]:
    """The stage's outputs when the estimator needs no critic: a note, no model, no batches, and
    an empty loss-curve folder (DVC wants every declared output to exist)."""
    note = (f"# No critic\n\n`algo.advantage: {params.algo.advantage}` compares episodes within "
            f"groups of {params.algo.group_size} started from one env seed, so it needs no value "
            "model: nothing was warmed up, and train loads no critic.\n")
    if is_main_process():
        for target in (out, work_dir):
            shutil.rmtree(target, ignore_errors=True)
            with atomic_dir(target) as tmp:
                (tmp / NO_CRITIC).write_text(note)
        shutil.rmtree(live_dir, ignore_errors=True)
        (live_dir / "plots" / "metrics").mkdir(parents=True)
    log.info("critic warm-up skipped: algo.advantage %s needs no critic", params.algo.advantage)
    return {"critic": 0.0, "turns": 0.0, "iterations": 0.0}


def _check(losses: list[float], max_final_loss: float | None) -> None:
    if max_final_loss is not None and losses[-1] > max_final_loss:
        raise WarmupDidNotConverge(
            f"critic warm-up: final value loss {losses[-1]:.5f} > warmup.max_final_loss "
            f"{max_final_loss} (first {losses[0]:.5f}); raise ppo.critic_lr or warmup.iterations")
    if len(losses) > 1 and losses[-1] >= losses[0]:
        log.warning("critic warm-up: value loss did not come down (%.5f -> %.5f); the targets "
                    "are re-computed with the critic each refit, and with few turns and sparse "
                    "rewards they are mostly noise: raise warmup.batches for more data",
                    losses[0], losses[-1])
