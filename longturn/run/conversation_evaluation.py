"""The chat protocol's part of an evaluation (run/evaluation.py plays the same seeds, writes the
same files and summarises them the same way for both protocols): episodes played by the rollout
function, one row per episode in the episode schema, so the report's paired test and the
summary read it unchanged.

In an episode row, a conversation's length is its number of replies and its valid actions are
its valid replies: those whose tool calls all ran (a reply without a call is valid).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from longturn.params.config import Params
from longturn.engines.base import Engine, SamplingParams
from longturn.run.eval_journal import EvalJournal
from longturn.run.evaluation import EvalPlan
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.env_episodes import EpisodeJob
from longturn.rollout.samples import samples_from_episodes


def episode_row(record: dict[str, Any]) -> dict[str, Any]:
    """One conversation in the episode schema (an env evaluation's episodes.parquet)."""
    valid = [bool(v) for v in record["reply_valid"]]  # ConversationRun.play sees it is there
    return {"run_id": record.get("run_id"), "policy_version": record.get("policy_version"),
            "env_name": "chat", "task": record["task"], "episode_id": record["episode_id"],
            "episode_seed": record["episode_seed"], "success": bool(record["success"]),
            "return": float(record["reward"]), "env_return": float(record["reward"]),
            "length": int(record["assistant_turns"]), "valid_actions": sum(valid),
            "valid_action_ratio": sum(valid) / len(valid) if valid else 1.0,
            "terminated": record["termination"] == "done", "truncated": bool(record["truncated"]),
            "aborted": bool(record.get("aborted")), "termination": record["termination"]}


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

    return EvalPlan(meta={"chat": params.rollout.chat.model_dump(),
                          "context": params.rollout.context},
                    flush_every=width, play=play, order=order)
