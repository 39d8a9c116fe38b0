"""Evaluation: play fixed seeds per task, write every turn and episode, summarise with intervals.

Seeds are `eval.seed + i` for episode i of every task, so zero-shot and final evaluations play the
same episodes (a paired comparison).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from longturn.atomic import write_json
from longturn.config import Params
from longturn.engines.base import Engine
from longturn.models import load_tokenizer
from longturn.rollout import AgentSettings, EpisodeJob, env_factory_from_params, play_episodes
from longturn.engines.registry import make_engine, sampling_from_params
from longturn.stats import standard_error, wilson_interval
from longturn.trajectories import write_episodes, write_turns

log = logging.getLogger(__name__)


def eval_jobs(tasks: list[str], episodes_per_task: int, base_seed: int) -> list[EpisodeJob]:
    """The same seeds for every task and every evaluation of a run."""
    return [
        EpisodeJob(task, base_seed + i, f"eval-{task}-{base_seed + i}")
        for task in tasks for i in range(episodes_per_task)
    ]


def summarise(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Success rate ± SE, Wilson 95% interval, mean return and length, valid-action ratio."""
    n = len(episodes)
    wins = sum(bool(e["success"]) for e in episodes)
    turns = sum(e["length"] for e in episodes)
    low, high = wilson_interval(wins, n)
    return {
        "episodes": n,
        "successes": wins,
        "success_rate": wins / n if n else 0.0,
        "success_se": standard_error(wins, n),
        "success_ci95_low": low,
        "success_ci95_high": high,
        "mean_return": sum(e["return"] for e in episodes) / n if n else 0.0,
        "mean_env_return": sum(e["env_return"] for e in episodes) / n if n else 0.0,
        "mean_length": turns / n if n else 0.0,
        "valid_action_ratio": sum(e["valid_actions"] for e in episodes) / turns if turns else 0.0,
    }


def metrics_by_task(episodes: list[dict[str, Any]], tasks: list[str]) -> dict[str, Any]:
    """{"overall": {...}, "tasks": {task: {...}}} — the metrics.json layout."""
    return {
        "overall": summarise(episodes),
        "tasks": {t: summarise([e for e in episodes if e["task"] == t]) for t in tasks},
    }


def evaluate(engine: Engine, tokenizer: Any, params: Params, out_dir: str | Path,
             policy_version: str, run_id: str = "eval", progress: bool = True) -> dict[str, Any]:
    """Play the eval episodes with `engine` and write turns/episodes Parquet and metrics.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    e = params.eval
    tasks = list(e.tasks or params.env.tasks)
    jobs = eval_jobs(tasks, e.episodes_per_task, e.seed)
    sampling = sampling_from_params(params, seed=e.seed, temperature=e.temperature)
    extra = {"run_id": run_id, "policy_version": policy_version, "iteration": 0}
    turns, episodes = play_episodes(
        engine, tokenizer, env_factory_from_params(params), jobs, e.parallel_envs, sampling,
        AgentSettings.from_params(params), extra=extra, progress=progress)
    for ep in episodes:
        ep.update(run_id=run_id, policy_version=policy_version)
    meta = {"policy_version": policy_version, "sampling": sampling.__dict__,
            "env": params.env.model_dump(), "prompt": params.prompt.model_dump()}
    write_turns(turns, out / "turns.parquet", meta)
    write_episodes(episodes, out / "episodes.parquet", meta)
    metrics = metrics_by_task(episodes, tasks)
    write_json(out / "metrics.json", metrics)
    log.info("eval %s: success %.3f (%d episodes, %d turns)", policy_version,
             metrics["overall"]["success_rate"], len(episodes), len(turns))
    return metrics


def evaluate_model(model_dir: str | Path, params: Params, out_dir: str | Path,
                   policy_version: str, progress: bool = True) -> dict[str, Any]:
    """Build the configured engine on `model_dir` and evaluate it."""
    engine = make_engine(str(model_dir), params)
    try:
        return evaluate(engine, load_tokenizer(model_dir), params, out_dir, policy_version,
                        progress=progress)
    finally:
        engine.close()
