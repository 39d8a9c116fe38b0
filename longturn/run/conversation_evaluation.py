"""Evaluation of the chat protocol: play `eval.episodes_per_task` episodes per task on seeds
`eval.seed + i` (the same in the zero-shot and the final evaluation, so they pair up), and write
what an env evaluation writes (run/evaluation.py): metrics.json (per task and overall), episodes.parquet (one row per episode
in the episode schema, so the report's paired test reads it unchanged) and turns.parquet: the
episodes as samples (one per whole episode, or one per reply of a history window).

In the metrics and the episode rows, an episode's length is its number of replies and its
valid-action ratio is the share of its tool calls that ran (1 when it made none).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from longturn.params.config import Params
from longturn.engines.base import Engine
from longturn.engines.registry import sampling_from_params
from longturn.run.eval_journal import EvalJournal
from longturn.run.eval_key import evaluation_key
from longturn.run.evaluation import write_outputs
from longturn.rollout.conversation_metrics import json_safe, conversation_metrics
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.samples import samples_from_episodes
from longturn.trajectories import SAMPLE_SCHEMA, SCHEMA_VERSION, file_metadata

log = logging.getLogger(__name__)


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


def evaluate_conversations(engine: Engine, tokenizer: Any, params: Params, out_dir: str | Path,
                       policy_version: str, run_id: str = "eval", progress: bool = True,
                       model_dir: str | Path | None = None) -> dict[str, Any]:
    """Play the eval episodes of every task with `engine`; write and return the metrics.

    Episodes are played `eval.parallel_envs` at a time, each chunk a call of its own (its draws
    depend on its episodes only), and each finished chunk goes to the journal
    (longturn/run/eval_journal.py): a rerun plays only the chunks missing from it, and the outputs,
    in job order, are assembled from it as an uninterrupted run would write them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    e = params.eval
    tasks = list(e.tasks or params.env.tasks)
    run = ConversationRun.from_params(params, tasks, progress)
    sampling = sampling_from_params(params, seed=e.seed, temperature=e.temperature)
    jobs = [(task, e.seed + i) for task in tasks for i in range(e.episodes_per_task)]
    ids = [f"eval-{t}-{s}" for t, s in jobs]
    meta = {"policy_version": policy_version, "sampling": sampling.__dict__,
            "chat": params.rollout.chat.model_dump(), "context": params.rollout.context}
    journal = EvalJournal.open(out, evaluation_key(params, policy_version, run_id, model_dir),
                               SAMPLE_SCHEMA, file_metadata(meta, version=SCHEMA_VERSION),
                               flush_every=e.parallel_envs)
    for start in range(0, len(jobs), e.parallel_envs):  # parallel_envs episodes at a time
        chunk = jobs[start:start + e.parallel_envs]
        if all(i in journal.finished for i in ids[start:start + e.parallel_envs]):
            continue
        played = run.play(engine, tokenizer, sampling, [run.record(t, s) for t, s in chunk],
                          ids[start:start + e.parallel_envs])
        for slot, record in enumerate(played, start):  # slots unique over the chunks
            record.update(run_id=run_id, policy_version=policy_version, iteration=0,
                          env_index=slot)
            journal.add(episode_row(record), samples_from_episodes([record]))
        journal.flush()
    position = {episode_id: i for i, episode_id in enumerate(ids)}
    table = journal.turns()
    played = table["episode_id"].to_pylist()
    table = table.take(sorted(range(table.num_rows), key=lambda r: position[played[r]]))
    samples = table.to_pylist()
    metrics = {"overall": summary(samples),
               "tasks": {t: summary([s for s in samples if s["task"] == t]) for t in tasks}}
    write_outputs(out, metrics, journal.episodes(ids), table, meta)
    journal.remove()
    o = metrics["overall"]
    log.info("eval %s: success %d/%d, replies %.1f per episode, tool calls %.1f (%s valid); "
             "ended: %s", policy_version, o["successes"], o["episodes"],
             o["mean_assistant_turns"], o["tool_calls_per_episode"],
             "n/a" if o["tool_call_validity"] is None else f"{o['tool_call_validity']:.2f}",
             json.dumps({k.split("/")[1]: v for k, v in o.items() if k.startswith("termination/")}))
    return metrics
