"""The train loop: rollout → Parquet → PPO update from that Parquet → new weights to the engine.

Resumable: a checkpoint (trainer engines, collector with its envs, metrics history) is written
atomically every `train.checkpoint_every` iterations; a restart continues after the last complete
one, deletes trajectories of iterations it is about to redo, and rebuilds the DVCLive log from the
saved history, so each iteration appears exactly once whatever moment the previous run died.
"""

from __future__ import annotations

import json
import logging
import pickle
import shutil
import time
from contextlib import ExitStack, closing, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from longturn.algo.trainer import PPOTrainer
from longturn.run.checkpoints import COMPLETE, CheckpointStore, iteration_dir
from longturn.params.config import Params
from longturn.device import resolve_device
from longturn.distributed import barrier, init_distributed, is_main_process, sum_over_ranks
from longturn.atomic import write_json
from longturn.run.dvc_remote import push_training_outputs
from longturn.run.headline import training_summary
from longturn.engines.registry import make_engine, sampling_from_params
from longturn.run.metrics import MetricsLog, PhaseClock, describe_iteration
from longturn.run.models import load_tokenizer
from longturn.profiling import IterationProfiler
from longturn.run.wiring import (batch_metrics, critic_dir, file_metadata, gae_params,
                                 make_collector, score_and_write, trainer_settings)
from longturn.run.resume_key import changed_parts, read_key, resume_key

if TYPE_CHECKING:
    from longturn.run.wiring import Collector

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainPaths:
    """Where the train stage reads and writes."""

    base: Path
    critic: Path
    trajectories: Path
    checkpoints: Path
    final: Path
    live: Path
    policy: Path  # the current actor as an HF dir, loaded by the inference engine
    summary: Path | None = None  # the headline numbers DVC shows (run/headline.py)


PARTIAL_FILE = "PARTIAL.json"  # in an actor exported by a run stopped at its deadline


@dataclass(frozen=True)
class Deadline:
    """A wall-clock time (seconds since the epoch) that no training iteration may run past."""

    at: float

    def allows(self, expected_seconds: float) -> bool:
        return time.time() + expected_seconds <= self.at


def _expected_seconds(history: list[dict[str, float]], profiled: int | None = None) -> float:
    """What the next iteration will take: the last one's time, checkpoint included (0 before the
    first), passing over the profiled iteration (its trace export took 5x the iteration itself
    on an H200) unless it is the only one. The stop's own checkpoint and export come after the
    deadline: leave room for them."""
    times = [float(m.get("seconds_per_iteration", 0.0)) for m in history]
    plain = [t for i, t in enumerate(times) if i != profiled]
    return (plain or times or [0.0])[-1]


def _stop_at_deadline(params: Params, paths: TrainPaths, trainer: PPOTrainer,
                      store: CheckpointStore, collector: Collector,
                      history: list[dict[str, float]], saved: bool) -> None:
    """Checkpoint the last iteration if it was not, and export the actor as it is, marked
    partial, so an evaluation can still run and a rerun resumes where this one stopped."""
    done = len(history)
    log.warning("deadline: stopping after %d of %d iterations; a rerun resumes from the "
                "checkpoint", done, params.train.iterations)
    if done == 0:
        return
    if not saved:
        store.write(trainer, collector.state(), done - 1)
        store.commit(done - 1, history)
    write_summary(paths, history)
    trainer.export_actor(paths.final)
    if is_main_process():
        (paths.final / PARTIAL_FILE).write_text(json.dumps(
            {"iterations_done": done, "iterations": params.train.iterations}) + "\n")


def _resume(store: CheckpointStore, trainer: PPOTrainer,
            collector: Collector) -> tuple[int, list[dict[str, float]]]:
    """Restore the last complete checkpoint; returns (next iteration, metrics history)."""
    ckpt = store.latest()
    if ckpt is None:
        return 0, []
    state = trainer.load_checkpoint(ckpt)
    collector.load_state((ckpt / f"collector_rank{trainer.rank}.pkl").read_bytes())
    history = pickle.loads((ckpt / "history.pkl").read_bytes())
    log.info("resuming after iteration %d from %s", state["iteration"], ckpt)
    return int(state["iteration"]) + 1, history


def _drop_unfinished(root: Path, start: int) -> None:
    """Trajectories of iterations that will be redone (a previous run died after writing them)."""
    if is_main_process():
        for d in root.glob("iteration=*"):
            if int(d.name.split("=")[1]) >= start:
                shutil.rmtree(d)
    barrier()


def _guard_persisted(params: Params, paths: TrainPaths) -> None:
    """Persisted checkpoints of another start (other params, critic, base model or chat files:
    run/resume_key.py) would silently mix two runs: start over instead."""
    if not is_main_process():
        barrier()
        return
    stamp = paths.checkpoints / "FINGERPRINT"
    key = resume_key(params, paths.base, critic_dir(params, paths.critic))
    changed = changed_parts(read_key(stamp.read_text()), key) if stamp.is_file() else []
    if changed:
        log.warning("%s changed since the checkpoints in %s were written: starting over",
                    " and ".join(changed), paths.checkpoints)
        shutil.rmtree(paths.checkpoints)
        shutil.rmtree(paths.trajectories, ignore_errors=True)
    paths.checkpoints.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(key, indent=1) + "\n")
    barrier()


def replay_update(params: Params, paths: TrainPaths, iteration_path: Path) -> dict[str, float]:
    """The update of one stored iteration, from its Parquet alone (no engine, no env). Starts
    from the checkpoint written just before that iteration when there is one."""
    rank, _ = init_distributed(resolve_device(params.engine.device))
    iteration = int(iteration_path.name.split("=")[1])
    trainer = PPOTrainer(paths.base, critic_dir(params, paths.critic), trainer_settings(params),
                         gae_params(params), load_tokenizer(paths.base))
    before = iteration_dir(paths.checkpoints, iteration - 1)
    if iteration > 0 and (before / COMPLETE).is_file():
        trainer.load_checkpoint(before)
    parts = sorted(iteration_path.glob(f"part-{rank:02d}.parquet"))
    if not parts:
        raise FileNotFoundError(f"no part-{rank:02d}.parquet under {iteration_path}")
    return trainer.update([str(p) for p in parts])


def run_training(params: Params, paths: TrainPaths, progress: bool = True,
                 run_id: str = "train", deadline: Deadline | None = None,
                 profiler: IterationProfiler | None = None) -> list[dict[str, float]]:
    """Train for `train.iterations` iterations (continuing a previous run); returns the history.

    With a `deadline`, no iteration starts that would end past it: the run stops early with a
    checkpoint (a rerun resumes there) and exports the actor as it is, with `PARTIAL.json` in
    the export naming the iterations done. `profiler` records one iteration's trace."""
    rank, _ = init_distributed(resolve_device(params.engine.device))
    _guard_persisted(params, paths)
    tokenizer = load_tokenizer(paths.base)
    trainer = PPOTrainer(paths.base, critic_dir(params, paths.critic), trainer_settings(params),
                         gae_params(params), tokenizer, progress=progress)
    with ExitStack() as stack:  # closes the engine, then the collector, on any exit
        collector = stack.enter_context(closing(make_collector(params, rank, run_id)))
        store = CheckpointStore(paths.checkpoints, params.train.keep_checkpoints)
        start, history = _resume(store, trainer, collector)
        _drop_unfinished(paths.trajectories, start)
        metrics_log = MetricsLog(paths.live, history, enabled=is_main_process())
        engine = stack.enter_context(closing(make_engine(str(paths.base), params)))
        if start > 0:  # resumed: the engine starts from the base weights, the actor has moved
            push_weights(trainer, engine, paths)
        saved = True
        for iteration in range(start, params.train.iterations):
            if deadline is not None and not deadline.allows(_expected_seconds(
                    history, profiler.iteration if profiler else None)):
                _stop_at_deadline(params, paths, trainer, store, collector, history, saved)
                return history
            clock = PhaseClock(trainer.device)
            with profiler.around(iteration) if profiler else nullcontext():
                metrics = _iteration(params, paths, trainer, collector, engine, tokenizer,
                                     iteration, run_id, rank, progress, clock)
                with clock.phase("sync"):
                    push_weights(trainer, engine, paths)
            if profiler:
                profiler.record_phases(iteration, clock)
            history.append(metrics)
            saved = ((iteration + 1) % params.train.checkpoint_every == 0
                     or iteration + 1 == params.train.iterations)
            if saved:
                with clock.phase("checkpoint"):
                    store.write(trainer, collector.state(), iteration)
            metrics.update(clock.metrics(metrics["turns"]))  # the history entry, before commit
            if saved:
                store.commit(iteration, history)
                if params.train.push and is_main_process():  # a failed push only warns
                    push_training_outputs(paths.trajectories, paths.checkpoints, iteration,
                                          params.train.remote)
            metrics_log.log(metrics)
            log.info(describe_iteration(iteration, metrics))
        write_summary(paths, history)
        trainer.export_actor(paths.final)
    return history


def write_summary(paths: TrainPaths, history: list[dict[str, float]]) -> None:
    """The run's headline numbers, for DVC (on the main process; a resumed run that had nothing
    left to train writes them too, as DVC removed the file before the rerun)."""
    if paths.summary is not None and is_main_process():
        write_json(paths.summary, training_summary(history))


def push_weights(trainer: PPOTrainer, engine: Any, paths: TrainPaths) -> None:
    """The actor's current weights to the inference engine: in memory when the engine can take
    them (in-process HF engine, unpartitioned weights), else as an HF dir it reloads from disk."""
    if hasattr(engine, "load_weights") and trainer.settings.zero_stage < 3:
        engine.load_weights(trainer.actor_weights())
    else:
        engine.update_weights(str(trainer.export_actor(paths.policy)))


def _iteration(params: Params, paths: TrainPaths, trainer: PPOTrainer,
               collector: Collector, engine: Any, tokenizer: Any, iteration: int,
               run_id: str, rank: int, progress: bool, clock: "PhaseClock") -> dict[str, float]:
    """Rollout, scoring, Parquet, update; the Parquet part is the only hand-off between rollout
    and update. Rollout metrics count every rank's turns; update metrics are averaged over
    ranks."""
    sampling = sampling_from_params(params, seed=params.seed)
    extra = {"run_id": run_id, "policy_version": f"iteration-{iteration}"}
    with clock.phase("rollout"):
        samples = collector.collect(engine, tokenizer, sampling, iteration, extra, progress)
    with clock.phase("scoring"):  # includes writing the iteration's Parquet part
        part = iteration_dir(paths.trajectories, iteration) / f"part-{rank:02d}.parquet"
        score_and_write(trainer, samples, part, file_metadata(params, iteration))
        barrier()
    metrics = batch_metrics(samples, collector)
    if not sum_over_ranks(np.array([float(any(map(_trains, samples)))]))[0]:
        log.warning("iteration %d: every episode was aborted or made no reply (see "
                    "termination/*): nothing to train on, so no update this iteration", iteration)
        return {**metrics, "update_skipped": 1.0}
    with clock.phase("update"):
        metrics.update(trainer.update([str(part)]))
    return metrics


def _trains(sample: dict[str, Any]) -> bool:
    """A sample has a loss token in a reply that was not aborted."""
    mask = sample["loss_mask"]
    return any(any(mask[r["start"]:r["end"]]) for r in sample["replies"] or ()
               if not r["aborted"])
