"""Evaluation: play fixed seeds per task, write every turn and episode, summarise with intervals.

Seeds are `eval.seed + i` for episode i of every task, so zero-shot and final evaluations play the
same episodes (a paired comparison). Episodes aborted by a failing env are counted apart
(`aborted_episodes`, `termination/<reason>`), never as failures. Episodes go to a journal as they
finish (`eval_journal.py`), so a rerun of a killed evaluation plays only the rest.

One driver (`evaluate`) serves both protocols and summarises both the same way; a protocol brings
an `EvalPlan`: how its episodes are played and ordered (`env_plan`, `conversation_plan`).
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
from longturn.run.headline import SUMMARY_FILE, evaluation_summary
from longturn.envs.termination import reason_of
from longturn.rollout.episode_jobs import EpisodeJob, lock_steps_held
from longturn.rollout.conversation_episodes import play_conversations, play_episode_jobs
from longturn.rollout.conversation_setup import ConversationRun
from longturn.engines.registry import sampling_from_params
from longturn.stats import standard_error, wilson_interval
from longturn.rollout.sample_metrics import (TOKENIZATION_KEYS, count_endings, json_safe,
                                             sample_metrics)
from longturn.trajectories import (SAMPLE_SCHEMA, SCHEMA_VERSION, file_metadata, write_arrow,
                                   write_episodes)

log = logging.getLogger(__name__)


def eval_jobs(tasks: list[str], episodes_per_task: int, base_seed: int) -> list[EpisodeJob]:
    """The same seeds for every task and every evaluation of a run."""
    return [
        EpisodeJob(task, base_seed + i, f"eval-{task}-{base_seed + i}")
        for task in tasks for i in range(episodes_per_task)
    ]


# what the samples add to the episode rows' summary: how replies were made and what they cost
SAMPLE_KEYS = ("response_tokens", "finish_length_ratio", "tool_calls_per_episode",
               "tool_call_validity", "mean_user_turns", "mean_tokens", "model_token_fraction",
               "images_per_episode", *TOKENIZATION_KEYS)


def summarise(episodes: list[dict[str, Any]],
              samples: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Success rate ± SE and Wilson 95% interval, mean return and length (replies), valid-action
    ratio, how many episodes ended for each termination reason and, from the episodes' samples,
    SAMPLE_KEYS (rollout/sample_metrics.py; null where nothing was counted).

    Aborted episodes (the env raised or hung) are counted apart, not as failures: the success rate,
    its interval and the means are over `completed_episodes` (named in `success_denominator`)."""
    n = len(episodes)
    done = [e for e in episodes if not e["aborted"]]
    m = len(done)
    wins = sum(bool(e["success"]) for e in done)
    turns = sum(e["length"] for e in done)
    low, high = wilson_interval(wins, m)
    out = {
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
        **count_endings(reason_of(e) for e in episodes),
    }
    if samples is not None:
        replies = sample_metrics(samples)
        out.update(json_safe({k: replies[k] for k in SAMPLE_KEYS if k in replies}))
    return out


def metrics_by_task(episodes: list[dict[str, Any]], tasks: list[str],
                    samples: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """{"overall": {...}, "tasks": {task: {...}}} — the metrics.json layout."""
    def of(task: str) -> list[dict[str, Any]] | None:
        return None if samples is None else [s for s in samples if s["task"] == task]

    return {
        "overall": summarise(episodes, samples),
        "tasks": {t: summarise([e for e in episodes if e["task"] == t], of(t)) for t in tasks},
    }


def describe(metrics: dict[str, Any], samples: int) -> str:
    """An evaluation's log line: success, how many episodes completed, replies per episode and,
    when a conversation made any, tool calls and how many of them did not fail."""
    o = metrics["overall"]
    line = (f"success {o['success_rate']:.3f} ({o['completed_episodes']} of {o['episodes']} "
            f"episodes completed, {o['aborted_episodes']} aborted; {samples} samples), "
            f"{o['mean_length']:.1f} replies per episode")
    if o.get("tool_calls_per_episode") is not None:
        validity = o.get("tool_call_validity")
        line += (f", {o['tool_calls_per_episode']:.1f} tool calls per episode "
                 f"({'n/a' if validity is None else f'{validity:.2f}'} ran)")
    return line


@dataclass(frozen=True)
class EvalPlan:
    """What a protocol brings to an evaluation: `play(jobs, journal)` plays the jobs the journal
    lacks and adds each finished episode to it; `order` puts the samples in the order an
    uninterrupted run writes them; `close` lets go of what the run holds, played or not (a rerun
    whose journal holds every job plays nothing)."""

    meta: dict[str, Any]
    flush_every: int
    play: Callable[[list[EpisodeJob], EvalJournal], None]
    order: Callable[[pa.Table, list[EpisodeJob]], pa.Table]
    close: Callable[[], None]


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
    tasks = list(e.tasks)
    jobs = eval_jobs(tasks, e.episodes_per_task, e.seed)
    sampling = sampling_from_params(params, seed=e.seed, temperature=e.temperature)
    extra = {"run_id": run_id, "policy_version": policy_version, "iteration": 0}
    plan = plan_for(engine, tokenizer, params, sampling, extra, progress)
    meta = {"policy_version": policy_version, "sampling": sampling.__dict__, **plan.meta}
    journal = EvalJournal.open(out, evaluation_key(params, policy_version, run_id, model_dir),
                               SAMPLE_SCHEMA, file_metadata(meta, version=SCHEMA_VERSION),
                               flush_every=plan.flush_every)
    try:
        if len(journal.finished) < len(jobs):
            plan.play(jobs, journal)
            journal.flush()
    finally:
        plan.close()
    episodes = journal.episodes([job.episode_id for job in jobs])
    samples = plan.order(journal.turns(), jobs)
    frames = [c for c in ("images", "bootstrap_images") if c in samples.column_names]
    # the metrics count frames by image_starts: the PNG bytes stay in Arrow, not copied to Python
    metrics = metrics_by_task(episodes, tasks, samples.drop_columns(frames).to_pylist())
    write_outputs(out, metrics, episodes, samples, meta)
    journal.remove()
    log.info("eval %s: %s", policy_version, describe(metrics, samples.num_rows))
    return metrics


def env_plan(engine: Engine, tokenizer: Any, params: Params, sampling: SamplingParams,
             extra: dict[str, Any], progress: bool) -> EvalPlan:
    """The action protocol: the env's episodes as conversations in lock-step, one sample per
    reply, each reply seeded by its episode's id and turn."""
    run = ConversationRun.of_env(params, list(params.eval.tasks), progress)
    return EvalPlan(meta={"env": params.env.model_dump(), "prompt": params.prompt.model_dump()},
                    flush_every=math.ceil(params.eval.parallel_envs / 8),
                    play=_in_slots(run, engine, tokenizer, params, sampling, extra, progress),
                    order=lambda samples, jobs: in_lock_step_order(samples), close=run.close)


def conversation_plan(engine: Engine, tokenizer: Any, params: Params, sampling: SamplingParams,
                      extra: dict[str, Any], progress: bool) -> EvalPlan:
    """The chat protocol: the built-in rollout plays `eval.parallel_envs` slots in lock-step,
    as an env's episodes are played, each reply seeded by its episode's id and turn; a rollout
    function of the user's plays that many episodes at a time, each chunk a call of its own, and
    the journal is written after each. Samples in job order."""
    run = ConversationRun.from_params(params, list(params.eval.tasks), progress)
    width = params.eval.parallel_envs
    if run.in_lock_steps:
        play = _in_slots(run, engine, tokenizer, params, sampling, extra, progress)
    else:
        run.settings.retry_failed_starts = False  # a job whose start failed is counted

        def play(jobs: list[EpisodeJob], journal: EvalJournal) -> None:
            play_conversations(run, engine, tokenizer, sampling, jobs, width, extra,
                               set(journal.finished), journal.add, journal.flush)

    def order(samples: pa.Table, jobs: list[EpisodeJob]) -> pa.Table:
        position = {job.episode_id: i for i, job in enumerate(jobs)}
        played = samples["episode_id"].to_pylist()
        return samples.take(sorted(range(samples.num_rows), key=lambda r: position[played[r]]))

    return EvalPlan(meta={"chat": params.rollout.chat.model_dump(),
                          "context": params.rollout.context},
                    flush_every=width, play=play, order=order, close=run.close)


def _in_slots(run: ConversationRun, engine: Engine, tokenizer: Any, params: Params,
              sampling: SamplingParams, extra: dict[str, Any], progress: bool
              ) -> Callable[[list[EpisodeJob], EvalJournal], None]:
    """An evaluation's play of a run that plays in lock-steps: `eval.parallel_envs` slots, each
    episode journaled as it ends; a job the journal has holds its slot as long as it played."""
    def play(jobs: list[EpisodeJob], journal: EvalJournal) -> None:
        play_episode_jobs(run, engine, tokenizer, jobs, params.eval.parallel_envs, sampling,
                          extra=extra, progress=progress, on_episode=journal.add,
                          finished={i: lock_steps_held(ep)
                                    for i, ep in journal.finished.items()})

    return play


def in_lock_step_order(samples: pa.Table) -> pa.Table:
    """Window samples (one reply each) by lock-step, then slot: the order they were played."""
    step = pc.struct_field(pc.list_element(samples["replies"], 0), "step")
    order = np.lexsort((samples["env_index"].to_numpy(zero_copy_only=False),
                        step.to_numpy(zero_copy_only=False)))
    return samples.take(pa.array(order))


def write_outputs(out: Path, metrics: dict[str, Any], episodes: list[dict[str, Any]],
                  turns: pa.Table, meta: dict[str, Any]) -> None:
    """summary.json (what DVC shows), metrics.json, episodes.parquet, turns.parquet: smallest
    first, and each tried even when one before it failed (a full disk), so a finished evaluation
    keeps what could be written; the first error is raised after the last write. `turns`: a
    table in its final schema."""
    turn_metadata = file_metadata(meta, version=SCHEMA_VERSION)
    writes = [(lambda: write_json(out / SUMMARY_FILE, evaluation_summary(metrics))),
              (lambda: write_json(out / "metrics.json", metrics)),
              (lambda: write_episodes(episodes, out / "episodes.parquet", meta)),
              (lambda: write_arrow(turns, out / "turns.parquet", turn_metadata))]
    first: Exception | None = None
    for write in writes:
        try:
            write()
        except Exception as err:
            log.error("could not write evaluation output: %s", err)
            first = first or err
    if first is not None:
        raise first
