"""Evaluation: play fixed seeds per task, write every turn and episode, summarise with intervals.

Seeds are `eval.seed + i` for episode i of every task, so zero-shot and final evaluations play the
same episodes (a paired comparison). Episodes aborted by a failing env are counted apart
(`aborted_episodes`, `termination/<reason>`), never as failures.

Episodes go to a journal as they finish (`eval_journal.py`): a rerun of a killed evaluation plays
only the episodes missing from it, and the outputs are assembled from it, so they are the same
files an uninterrupted run writes: episodes in job order (task, then seed), samples in the order
they were played.

One driver (`evaluate`) serves both ways of reading replies; a protocol brings an `EvalPlan`: how
its episodes are played, ordered, summarised and logged. The action protocol's plan is here
(`env_plan`), the chat protocol's in conversation_evaluation.py.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from longturn.atomic import write_json
from longturn.params.config import Params
from longturn.engines.base import Engine, SamplingParams
from longturn.run.eval_journal import EvalJournal
from longturn.run.eval_key import evaluation_key
from longturn.envs.termination import count, reason_of
from longturn.rollout.env_episodes import EpisodeJob, play_episodes
from longturn.rollout.env_slots import AgentSettings, env_factory_from_params
from longturn.engines.registry import sampling_from_params
from longturn.stats import standard_error, wilson_interval
from longturn.rollout.samples import samples_from_turns
from longturn.trajectories import (SAMPLE_SCHEMA, SCHEMA_VERSION, file_metadata, write_arrow,
                                   write_episodes, write_samples)

log = logging.getLogger(__name__)


def eval_jobs(tasks: list[str], episodes_per_task: int, base_seed: int) -> list[EpisodeJob]:
    """The same seeds for every task and every evaluation of a run."""
    return [
        EpisodeJob(task, base_seed + i, f"eval-{task}-{base_seed + i}")
        for task in tasks for i in range(episodes_per_task)
    ]


def summarise(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Success rate ± SE and Wilson 95% interval, mean return and length, valid-action ratio, and
    how many episodes ended for each termination reason.

    Aborted episodes (the env raised or hung) are counted apart, not as failures: the success rate,
    its interval and the means are over `completed_episodes` (named in `success_denominator`)."""
    n = len(episodes)
    done = [e for e in episodes if not e["aborted"]]
    m = len(done)
    wins = sum(bool(e["success"]) for e in done)
    turns = sum(e["length"] for e in done)
    low, high = wilson_interval(wins, m)
    return {
        "episodes": n,
        "aborted_episodes": n - m,
        "completed_episodes": m,
        "success_denominator": "completed_episodes",
        "successes": wins,
        "success_rate": wins / m if m else 0.0,
        "success_se": standard_error(wins, m),
        "success_ci95_low": low,
        "success_ci95_high": high,
        "mean_return": sum(e["return"] for e in done) / m if m else 0.0,
        "mean_env_return": sum(e["env_return"] for e in done) / m if m else 0.0,
        "mean_length": turns / m if m else 0.0,
        "valid_action_ratio": sum(e["valid_actions"] for e in done) / turns if turns else 0.0,
        **count(reason_of(e) for e in episodes),
    }


def metrics_by_task(episodes: list[dict[str, Any]], tasks: list[str]) -> dict[str, Any]:
    """{"overall": {...}, "tasks": {task: {...}}} — the metrics.json layout."""
    return {
        "overall": summarise(episodes),
        "tasks": {t: summarise([e for e in episodes if e["task"] == t]) for t in tasks},
    }


@dataclass(frozen=True)
class EvalPlan:
    """What a protocol brings to an evaluation; `evaluate` does the rest the same way for both.

    `play(jobs, journal)` plays the jobs the journal lacks and adds each finished episode (its
    episode row and samples) to it; `order` puts the samples in the order an uninterrupted run
    writes them; `metrics(episodes, samples, tasks)` is metrics.json; `describe` its log line."""

    meta: dict[str, Any]
    flush_every: int
    play: Callable[[list[EpisodeJob], EvalJournal], None]
    order: Callable[[pa.Table, list[EpisodeJob]], pa.Table]
    metrics: Callable[[list[dict[str, Any]], pa.Table, list[str]], dict[str, Any]]
    describe: Callable[[dict[str, Any], pa.Table], str]


PlanFactory = Callable[[Engine, Any, Params, SamplingParams, dict[str, Any], bool], EvalPlan]


def evaluate(plan_for: PlanFactory, engine: Engine, tokenizer: Any, params: Params,
             out_dir: str | Path, policy_version: str, run_id: str = "eval",
             progress: bool = True, model_dir: str | Path | None = None) -> dict[str, Any]:
    """Play `eval.episodes_per_task` episodes of every task on seeds `eval.seed + i` with
    `engine` (on the weights in `model_dir`, which keys the journal of an evaluation that died),
    as the protocol's plan says, and write metrics.json, episodes.parquet and turns.parquet."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    e = params.eval
    tasks = list(e.tasks or params.env.tasks)
    jobs = eval_jobs(tasks, e.episodes_per_task, e.seed)
    sampling = sampling_from_params(params, seed=e.seed, temperature=e.temperature)
    extra = {"run_id": run_id, "policy_version": policy_version, "iteration": 0}
    plan = plan_for(engine, tokenizer, params, sampling, extra, progress)
    meta = {"policy_version": policy_version, "sampling": sampling.__dict__, **plan.meta}
    journal = EvalJournal.open(out, evaluation_key(params, policy_version, run_id, model_dir),
                               SAMPLE_SCHEMA, file_metadata(meta, version=SCHEMA_VERSION),
                               flush_every=plan.flush_every)
    if len(journal.finished) < len(jobs):
        plan.play(jobs, journal)
        journal.flush()
    episodes = journal.episodes([job.episode_id for job in jobs])
    samples = plan.order(journal.turns(), jobs)
    metrics = plan.metrics(episodes, samples, tasks)
    write_outputs(out, metrics, episodes, samples, meta)
    journal.remove()
    log.info("eval %s: %s", policy_version, plan.describe(metrics, samples))
    return metrics


def env_plan(engine: Engine, tokenizer: Any, params: Params, sampling: SamplingParams,
             extra: dict[str, Any], progress: bool) -> EvalPlan:
    """The action protocol: env slots in lock-step, one sample per reply."""

    def play(jobs: list[EpisodeJob], journal: EvalJournal) -> None:
        play_episodes(engine, tokenizer, env_factory_from_params(params), jobs,
                      params.eval.parallel_envs, sampling, AgentSettings.from_params(params),
                      extra=extra, progress=progress,
                      on_episode=lambda episode, turns: journal.add(episode,
                                                                    samples_from_turns(turns)),
                      finished={i: ep["length"] for i, ep in journal.finished.items()})

    def describe(metrics: dict[str, Any], samples: pa.Table) -> str:
        o = metrics["overall"]
        return (f"success {o['success_rate']:.3f} ({o['completed_episodes']} of {o['episodes']} "
                f"episodes completed, {o['aborted_episodes']} aborted; {samples.num_rows} turns)")

    return EvalPlan(meta={"env": params.env.model_dump(), "prompt": params.prompt.model_dump()},
                    flush_every=math.ceil(params.eval.parallel_envs / 8), play=play,
                    order=lambda samples, jobs: in_lock_step_order(samples),
                    metrics=lambda episodes, samples, tasks: metrics_by_task(episodes, tasks),
                    describe=describe)


def in_lock_step_order(samples: pa.Table) -> pa.Table:
    """Window samples (one reply each) by lock-step, then env slot: the order they were played."""
    step = pc.struct_field(pc.list_element(samples["replies"], 0), "step")
    order = np.lexsort((samples["env_index"].to_numpy(zero_copy_only=False),
                        step.to_numpy(zero_copy_only=False)))
    return samples.take(pa.array(order))


def write_outputs(out: Path, metrics: dict[str, Any], episodes: list[dict[str, Any]],
                  turns: pa.Table | list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """metrics.json, episodes.parquet, turns.parquet: smallest first, and each tried even when
    one before it failed (a full disk), so a finished evaluation keeps what could be written; the
    first error is raised after the last write. `turns`: a table in its final schema, or rows."""
    def write_turn_file() -> None:
        if isinstance(turns, pa.Table):
            write_arrow(turns, out / "turns.parquet", file_metadata(meta, version=SCHEMA_VERSION))
        else:
            write_samples(turns, out / "turns.parquet", meta)

    writes = [(lambda: write_json(out / "metrics.json", metrics)),
              (lambda: write_episodes(episodes, out / "episodes.parquet", meta)),
              write_turn_file]
    first: Exception | None = None
    for write in writes:
        try:
            write()
        except Exception as err:
            log.error("could not write evaluation output: %s", err)
            first = first or err
    if first is not None:
        raise first
