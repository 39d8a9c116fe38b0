"""Conversations played to their end outside the train loop: evaluation's jobs (task, seed, id),
handed on as samples and one episode row each as rollout/env_episodes.py hands on an env's
episodes, and prompt validation's whole conversations as packed samples. So evaluation and
validation read neither protocol's record.

The run's rollout function plays `width` jobs at a time, each chunk a call of its own: a chunk's
draws depend on its episodes only, so a rerun after a crash plays only the chunks its journal
lacks (run/eval_journal.py). In an episode row, a conversation's length is its number of replies
and its valid actions are its valid replies: those whose tool calls all ran (a reply without a
call is valid).
"""

from __future__ import annotations

from typing import Any, Callable

from longturn.engines.base import Engine, SamplingParams
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.collection import EpisodeJob
from longturn.rollout.samples import sample_from_episode, samples_from_episodes


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


def play_conversations(run: ConversationRun, engine: Engine, tokenizer: Any,
                       sampling: SamplingParams, jobs: list[EpisodeJob], width: int,
                       extra: dict[str, Any], finished: set[str],
                       on_episode: Callable[[dict[str, Any], list[dict[str, Any]]], None],
                       on_chunk: Callable[[], None] = lambda: None) -> None:
    """Play every chunk of `width` jobs that has a job not in `finished`; each episode's row and
    samples go to `on_episode(episode, samples)`, then `on_chunk()` once per chunk played."""
    for start in range(0, len(jobs), width):
        chunk = jobs[start:start + width]
        if all(job.episode_id in finished for job in chunk):
            continue
        played = run.play(engine, tokenizer, sampling,
                          [run.record(job.task, job.seed) for job in chunk],
                          [job.episode_id for job in chunk])
        for slot, record in enumerate(played, start):  # slots unique over the chunks
            record.update(extra, env_index=slot)
            on_episode(episode_row(record), samples_from_episodes([record]))
        on_chunk()


def packed_samples(run: ConversationRun, engine: Engine, tokenizer: Any,
                   sampling: SamplingParams, task: str, seeds: list[int],
                   id_prefix: str) -> list[dict[str, Any]]:
    """One call of the rollout function on `seeds` of `task`: one packed sample per episode
    whatever the context, for a reader of whole conversations (prompt validation)."""
    return [sample_from_episode(record) for record in run.play(
        engine, tokenizer, sampling, [run.record(task, s) for s in seeds],
        [f"{id_prefix}-{task}-{s}" for s in seeds])]
