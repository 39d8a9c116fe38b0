"""The chat protocol's part of an evaluation (run/evaluation.py plays the same seeds and writes
the same files for both protocols): episodes played by the rollout function, one row per episode
in the episode schema (so the report's paired test reads it unchanged), and metrics of the
conversations' samples (one per whole episode, or one per reply of a history window).

In the metrics and the episode rows, an episode's length is its number of replies and its
valid-action ratio is the share of its tool calls that ran (1 when it made none).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from longturn.params.config import Params
from longturn.engines.base import Engine, SamplingParams
from longturn.run.eval_journal import EvalJournal
from longturn.run.evaluation import EvalPlan
from longturn.rollout.conversation_metrics import json_safe, conversation_metrics
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.env_episodes import EpisodeJob
from longturn.rollout.samples import samples_from_episodes


def episode_row(record: dict[str, Any]) -> dict[str, Any]:
    """One conversation in the episode schema (an env evaluation's episodes.parquet)."""
    calls, errors = int(record["tool_calls"]), int(record["tool_errors"])
    return {"run_id": record.get("run_id"), "policy_version": record.get("policy_version"),
            "env_name": "chat", "task": record["task"], "episode_id": record["episode_id"],
            "episode_seed": record["episode_seed"], "success": bool(record["success"]),
            "return": float(record["reward"]), "env_return": float(record["reward"]),
            "length": int(record["assistant_turns"]), "valid_actions": calls - errors,
            "valid_action_ratio": (calls - errors) / calls if calls else 1.0,
            "terminated": record["termination"] == "done", "truncated": bool(record["truncated"]),
            "aborted": bool(record.get("aborted")), "termination": record["termination"]}


def summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """conversation_metrics of the samples plus the keys the report reads of an env evaluation;
    NaN as null (JSON)."""
    m = conversation_metrics(samples)
    aborted = int(m.get("termination/agent_error", 0) + m.get("termination/timeout", 0))
    m.update(completed_episodes=m["episodes"] - aborted, aborted_episodes=aborted,
             success_denominator="completed_episodes", mean_length=m["mean_assistant_turns"],
             valid_action_ratio=m["tool_call_validity"])
    return json_safe(m)


def conversation_plan(engine: Engine, tokenizer: Any, params: Params, sampling: SamplingParams,
                      extra: dict[str, Any], progress: bool) -> EvalPlan:
    """The chat protocol: the rollout function plays `eval.parallel_envs` episodes at a time,
    each chunk a call of its own (its draws depend on its episodes only), so a rerun plays only
    the chunks missing from the journal."""
    run = ConversationRun.from_params(params, list(params.eval.tasks or params.env.tasks),
                                      progress)
    width = params.eval.parallel_envs

    def play(jobs: list[EpisodeJob], journal: EvalJournal) -> None:
        for start in range(0, len(jobs), width):
            chunk = jobs[start:start + width]
            if all(job.episode_id in journal.finished for job in chunk):
                continue
            played = run.play(engine, tokenizer, sampling,
                              [run.record(job.task, job.seed) for job in chunk],
                              [job.episode_id for job in chunk])
            for slot, record in enumerate(played, start):  # slots unique over the chunks
                record.update(extra, env_index=slot)
                journal.add(episode_row(record), samples_from_episodes([record]))
            journal.flush()

    def order(samples: pa.Table, jobs: list[EpisodeJob]) -> pa.Table:
        position = {job.episode_id: i for i, job in enumerate(jobs)}
        played = samples["episode_id"].to_pylist()
        return samples.take(sorted(range(samples.num_rows), key=lambda r: position[played[r]]))

    def metrics(episodes: list[dict[str, Any]], samples: pa.Table,
                tasks: list[str]) -> dict[str, Any]:
        rows = samples.to_pylist()
        return {"overall": summary(rows),
                "tasks": {t: summary([s for s in rows if s["task"] == t]) for t in tasks}}

    def describe(metrics: dict[str, Any], samples: pa.Table) -> str:
        o = metrics["overall"]
        validity = o["tool_call_validity"]
        ended = {k.split("/")[1]: v for k, v in o.items() if k.startswith("termination/")}
        return (f"success {o['successes']}/{o['episodes']}, replies "
                f"{o['mean_assistant_turns']:.1f} per episode, tool calls "
                f"{o['tool_calls_per_episode']:.1f} "
                f"({'n/a' if validity is None else f'{validity:.2f}'} valid); ended: "
                f"{json.dumps(ended)}")

    return EvalPlan(meta={"chat": params.rollout.chat.model_dump(),
                          "context": params.rollout.context},
                    flush_every=width, play=play, order=order, metrics=metrics,
                    describe=describe)
