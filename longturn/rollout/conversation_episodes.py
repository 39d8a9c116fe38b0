"""Conversations played outside the train loop: evaluation's jobs (task, seed, id) to their end,
handed on as samples and one episode row each; prompt validation's whole conversations as packed
samples, and an env's first replies as training's first lock-step plays them. So evaluation and
validation read no conversation record.

- A run that plays in lock-steps (an env's conversations, `ConversationRun.of_env`, or the
  built-in chat rollout's): up to `width` slots in lock-step (`play_jobs`), a slot taking the
  next job as soon as its episode ends (no wait for a chunk's longest episode), each reply
  sampling from seeds of its episode's id and turn alone, so an episode plays the same whatever
  shares its lock-steps, and a rerun plays only what the journal lacks.
- A rollout function of the user's (an agent's, slime's) plays `width` jobs at a time, each
  chunk a call of its own: a chunk's draws depend on its episodes only, so a rerun after a
  crash plays only the chunks its journal lacks (run/eval_journal.py).

An episode's row is read from its samples (rollout/sample_metrics.py `episode_row`).
"""

from __future__ import annotations

from typing import Any, Callable

from longturn.engines.base import Engine, SamplingParams
from longturn.errors import UserError
from longturn.rollout.collection import EpisodeStart
from longturn.rollout.conversation_setup import ConversationRun
from longturn.rollout.conversation_player import ConversationPlayer
from longturn.rollout.episode_jobs import EpisodeJob, play_jobs
from longturn.rollout.sample_metrics import episode_row, unstarted_row
from longturn.rollout.samples import sample_from_episode, samples_from_episodes


def play_conversations(run: ConversationRun, engine: Engine, tokenizer: Any,
                       sampling: SamplingParams, jobs: list[EpisodeJob], width: int,
                       extra: dict[str, Any], finished: set[str],
                       on_episode: Callable[[dict[str, Any], list[dict[str, Any]]], None],
                       on_chunk: Callable[[], None] = lambda: None) -> None:
    """Play every chunk of `width` jobs that has a job not in `finished`; each episode's row and
    samples go to `on_episode(episode, samples)`, then `on_chunk()` once per chunk played. A job
    whose start failed (the built-in rollout, told not to retry it: `retry_failed_starts`) is an
    aborted row of no sample, as the action protocol's evaluation writes it."""
    for start in range(0, len(jobs), width):
        chunk = jobs[start:start + width]
        if all(job.episode_id in finished for job in chunk):
            continue
        played = run.play(engine, tokenizer, sampling,
                          [run.record(job.task, job.seed) for job in chunk],
                          [job.episode_id for job in chunk])
        for slot, record in enumerate(played, start):  # slots unique over the chunks
            record.update(extra, env_index=slot)
            if record.get("unstarted"):  # its start failed: counted, and the next job plays
                on_episode(unstarted_row(extra, record.get("env_name"), record["task"],
                                         record["episode_id"], record["episode_seed"],
                                         record["termination"]), [])
                continue
            samples = samples_from_episodes([record])
            on_episode(episode_row(samples), samples)
        on_chunk()


def packed_samples(run: ConversationRun, engine: Engine, tokenizer: Any,
                   sampling: SamplingParams, task: str, seeds: list[int],
                   id_prefix: str) -> list[dict[str, Any]]:
    """One call of the rollout function on `seeds` of `task`: one packed sample per episode
    whatever the context, for a reader of whole conversations (prompt validation)."""
    return [sample_from_episode(record) for record in run.play(
        engine, tokenizer, sampling, [run.record(task, s) for s in seeds],
        [f"{id_prefix}-{task}-{s}" for s in seeds])]


def first_replies(run: ConversationRun, engine: Engine, tokenizer: Any, sampling: SamplingParams,
                  task: str, seeds: list[int], id_prefix: str) -> list[dict[str, Any]]:
    """The first reply of `task`'s episode on each seed (an env's conversations: prompt
    validation's), played as the first lock-step of a fixed-turn batch plays them: the prompt
    the rollout renders, the reply read as an action and stepped, cut there. One sample per
    seed, in seed order, each reply sampling from its episode's seeds (keyed seeds). An episode
    that cannot start stops it: nothing can be validated on it."""
    player = ConversationPlayer(run, len(seeds), fixed_turns=True, keyed_seeds=True)
    try:
        failed = player.start([EpisodeStart(slot, task, seed, f"{id_prefix}-{task}-{seed}")
                               for slot, seed in enumerate(seeds)])
        if failed:
            raise UserError(f"task {task!r} seed {failed[0].seed}: the episode could not start "
                            f"({failed[0].failure}), so its first reply cannot be validated")
        samples, _ = player.lock_step(engine, tokenizer, sampling, 0, 0, closes_batch=True)
    finally:
        player.close()
    return samples


def play_episode_jobs(
    run: ConversationRun, engine: Engine, tokenizer: Any, jobs: list[EpisodeJob], width: int,
    sampling: SamplingParams, extra: dict[str, Any] | None = None, progress: bool = True,
    finished: dict[str, int] | None = None,
    on_episode: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Play every job (an evaluation's) to its end in up to `width` slots in lock-step
    (`play_jobs`; a run that plays `in_lock_steps`: an env's, or the built-in chat rollout's),
    each reply sampling from its episode's seeds (keyed seeds), so an episode plays the same
    whatever shares its lock-steps and however wide they are.

    Returns (samples, episode rows) of the jobs played here, episode after episode as they
    ended; a job whose start failed is an episode row, `aborted`, of no reply. Jobs in
    `finished` (episode id → lock-steps, `lock_steps_held`) are not played but keep their slot
    for as many lock-steps. `on_episode(episode, samples)` is called as each episode ends (an
    evaluation's journal); the samples then go only there, not into the returned list as
    well."""
    extra, finished = extra or {}, finished or {}
    player = ConversationPlayer(run, min(width, len(jobs)), fixed_turns=False, keyed_seeds=True)
    episodes: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    keep = on_episode or (lambda episode, samples: kept.extend(samples))

    def ended(episode: dict[str, Any], samples: list[dict[str, Any]]) -> None:
        episodes.append(episode)
        keep(episode, samples)

    def played(samples: list[dict[str, Any]]) -> None:
        for sample in samples:
            sample.update(extra)
        ended(episode_row(samples), samples)

    def unstarted(slot: int, job: EpisodeJob, reason: str) -> None:
        ended(unstarted_row(extra, run.record(job.task, job.seed).get("env_name"), job.task,
                            job.episode_id, job.seed, reason), [])

    try:
        play_jobs(player, engine, tokenizer, sampling, jobs, finished, played, unstarted,
                  progress)
    finally:
        player.close()
    return kept, episodes
