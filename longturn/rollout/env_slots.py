"""Vectorised env stepping: many env slots advance in lock-step with one batched generation.

`EnvSlot` owns one environment and the agent's view of its current episode (history window, turn
counter, episode id); it renders the next prompt and applies a completion, producing one turn row of
the Parquet contract. `play_episodes` runs a queue of (task, seed) episodes to completion (eval).

Env calls are split into submit and wait (`longturn/envs/local.py`, `workers.py`): a lock-step sends
every slot's action first, then reads the results in slot order and renders each slot's next
prompt as soon as its result is in, while envs in worker processes are still stepping. An env that
raises, dies or hangs past `env.step_timeout_s` aborts its episode (`aborted`, out of the loss,
counted by termination reason) and is restarted; more than `env.max_retries` failures of one slot
in a row stop the stage (`EnvGaveUp`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable

from tqdm.auto import tqdm

from longturn.agent.memory import HistoryWindow
from longturn.agent.prompts import Prompt, build_prompt, history_reply
from longturn.params.config import Params
from longturn.engines.base import Completion, Engine, SamplingParams
from longturn.engines.row_seeds import keyed_seed, row_seed
from longturn.envs.base import TextEnv
from longturn.envs.failures import EnvFailure, EnvGaveUp
from longturn.envs.local import LocalEnv, managed
from longturn.envs.registry import EnvSpec, translator_for
from longturn.envs.termination import reason_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentSettings:
    """How an agent turns env output into prompts and model output into actions, and how many env
    failures in a row one slot survives. No defaults of its own: `from_params` reads the prompt
    and env sections, the one place defaults live."""

    history_turns: int | None  # None: every past turn (rollout.context episode)
    history_content: str
    invalid_in_history: str
    max_prompt_tokens: int
    demonstration: bool
    invalid_action_penalty: float
    max_turns: int | None
    max_retries: int

    @classmethod
    def from_params(cls, params: Params) -> "AgentSettings":
        p, e = params.prompt, params.env
        whole = params.rollout.context == "episode"
        return cls(history_turns=None if whole else p.history_turns,
                   history_content=p.history_content,
                   invalid_in_history=p.invalid_in_history,
                   max_prompt_tokens=p.max_prompt_tokens, demonstration=p.demonstration,
                   invalid_action_penalty=e.invalid_action_penalty, max_turns=e.max_turns,
                   max_retries=e.max_retries)


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to play: which task, which reset seed, which id."""

    task: str
    seed: int
    episode_id: str


def _one_line(text: str) -> str:
    return " ".join(text.split())


class EnvSlot:
    """One environment slot and the agent's state for the episode running in it."""

    def __init__(self, env: TextEnv, env_index: int, settings: AgentSettings):
        self.env = managed(env)
        self.env_index = env_index
        self.settings = settings
        self.translator = translator_for(self.env)
        self.history = HistoryWindow(settings.history_turns)
        self.episode_id = ""
        self.seed = 0
        self.turn = 0
        self.observation = ""
        self.failures = 0  # env failures in a row (a successful step clears it)
        self._prompt: tuple[Any, Prompt] | None = None  # (tokenizer, prompt) of the current state
        self._pending: tuple | None = None  # what `send` started, for `receive`
        self._starting: tuple[int, str] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_prompt=None, _pending=None, _starting=None)  # rebuilt; never mid-call
        return state

    # ------------------------------------------------------------------ episodes

    def begin_start(self, seed: int, episode_id: str) -> None:
        """Send the reset of a new episode; `finish_start` reads it."""
        self._starting = (seed, episode_id)
        self.env.submit_reset(seed)

    def finish_start(self) -> EnvFailure | None:
        """The reset's outcome: None when the episode runs, else the failure (the env has been
        restarted; the episode never had a turn)."""
        seed, episode_id = self._starting
        self._starting = None
        self.seed, self.episode_id = seed, episode_id
        try:
            obs, _ = self.env.wait_reset()
        except EnvFailure as failure:
            self._failed(failure, "reset")
            return failure
        self.history.clear()
        self.turn, self.observation, self._prompt = 0, obs.text, None
        return None

    def start(self, seed: int, episode_id: str) -> None:
        """Reset for a new episode; raises the EnvFailure when the reset failed."""
        self.begin_start(seed, episode_id)
        failure = self.finish_start()
        if failure is not None:
            raise failure

    def _failed(self, failure: EnvFailure, call: str) -> None:
        """Count a failure, restart the env, or give up after env.max_retries in a row."""
        self.failures += 1
        env, s = self.env, self.settings
        log.warning("env %s/%s %s failed (%s) on seed %s turn %s, episode aborted: %s%s",
                    env.name, env.task, call, failure.reason, self.seed, self.turn,
                    failure.message, "\n" + failure.details if failure.details else "")
        if self.failures > s.max_retries:
            raise EnvGaveUp(
                f"env {env.name!r} task {env.task!r} failed {self.failures} times in a row, the "
                f"last on seed {self.seed} ({call}, {failure.reason}: "
                f"{_one_line(failure.message)}); env.max_retries is {s.max_retries}: fix the env "
                "or raise env.max_retries")
        env.restart()

    # ------------------------------------------------------------------ turns

    def prompt(self, tokenizer: Any) -> Prompt:
        """The prompt of the current observation (rendered once per state)."""
        if self._prompt is None or self._prompt[0] is not tokenizer:
            prompt = build_prompt(tokenizer, self.env.instructions, self.history.entries(),
                                  self.observation, self.settings.max_prompt_tokens,
                                  self.settings.demonstration)
            self._prompt = (tokenizer, prompt)
        return self._prompt[1]

    def send(self, prompt: Prompt, completion: Completion, response_text: str) -> None:
        """Parse the action and start the env step; `receive` finishes the turn."""
        parsed = self.translator.parse(response_text)
        self._pending = (prompt, completion, response_text, parsed)
        self.env.submit_step(parsed.action)

    def receive(self) -> dict[str, Any]:
        """The turn row of the step `send` started. `row['done']` says the episode ended;
        `row['termination']` says why (docs: longturn/envs/termination.py)."""
        prompt, completion, response_text, parsed = self._pending
        self._pending = None
        row = self._base_row(prompt, completion, response_text, parsed)
        try:
            obs, env_reward, terminated, truncated, info = self.env.wait_step()
        except EnvFailure as failure:  # an env bug must not kill a long run: drop the episode
            row.update(env_reward=0.0, reward=0.0, terminated=False, truncated=False,
                       success=False, aborted=True, done=True, termination=failure.reason)
            self._failed(failure, "step")
            return row
        self.failures = 0
        if self.settings.max_turns and self.turn + 1 >= self.settings.max_turns:
            truncated = True
        penalty = 0.0 if parsed.valid else self.settings.invalid_action_penalty
        row.update(env_reward=float(env_reward), reward=float(env_reward) - penalty,
                   terminated=bool(terminated), truncated=bool(truncated) and not terminated,
                   success=bool(info.get("success", False)), aborted=False,
                   done=bool(terminated or truncated))
        row["termination"] = reason_of(row) if row["done"] else None
        s = self.settings
        reply = history_reply(response_text, parsed.action, parsed.valid,
                              s.history_content, s.invalid_in_history)  # type: ignore[arg-type]
        self.history.add(self.observation, reply)
        self.observation = obs.text
        self.turn += 1
        self._prompt = None
        return row

    def apply(self, prompt: Prompt, completion: Completion, response_text: str) -> dict[str, Any]:
        """Execute the parsed action; return the turn row. `row['done']` says the episode ended."""
        self.send(prompt, completion, response_text)
        return self.receive()

    def _base_row(self, prompt: Prompt, completion: Completion, text: str,
                  parsed: Any) -> dict[str, Any]:
        return {
            "env_index": self.env_index, "env_name": self.env.name, "task": self.env.task,
            "episode_id": self.episode_id, "episode_seed": self.seed, "turn": self.turn,
            "prompt_ids": prompt.ids, "response_ids": completion.token_ids,
            "prompt_text": prompt.text, "response_text": text,
            "raw_action": parsed.raw_action, "action": parsed.action,
            "action_valid": parsed.valid, "action_failure": parsed.failure,
            "finish_reason": completion.finish_reason, "history_dropped": prompt.history_dropped,
            "engine_logprobs": completion.logprobs, "observation": self.observation,
        }


def generate_turns(engine: Engine, tokenizer: Any, slots: list[EnvSlot],
                   sampling: SamplingParams) -> list[dict[str, Any]]:
    """One lock-step: every slot's prompt, one batched generation, every action sent to its env,
    then each result read in slot order, the slot's next prompt rendered while later envs step."""
    prompts = [slot.prompt(tokenizer) for slot in slots]
    completions = engine.generate([p.ids for p in prompts], sampling)
    for slot, prompt, completion in zip(slots, prompts, completions):
        slot.send(prompt, completion, tokenizer.decode(completion.token_ids,
                                                       skip_special_tokens=True))
    rows = []
    for slot in slots:
        row = slot.receive()
        if not row["done"]:
            slot.prompt(tokenizer)
        rows.append(row)
    return rows


def summarise_episode(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One episodes.parquet row from the turn rows of one finished episode."""
    first, last = rows[0], rows[-1]
    valid = sum(bool(r["action_valid"]) for r in rows)
    return {
        "run_id": first.get("run_id"), "policy_version": first.get("policy_version"),
        "env_name": first["env_name"], "task": first["task"], "episode_id": first["episode_id"],
        "episode_seed": first["episode_seed"], "success": any(r["success"] for r in rows),
        "return": float(sum(r["reward"] for r in rows)),
        "env_return": float(sum(r["env_reward"] for r in rows)),
        "length": len(rows), "valid_actions": valid, "valid_action_ratio": valid / len(rows),
        "terminated": bool(last["terminated"]), "truncated": bool(last["truncated"]),
        "aborted": bool(last["aborted"]), "termination": reason_of(last),
    }


def unstarted_episode(slot: EnvSlot, job: EpisodeJob, reason: str,
                      extra: dict[str, Any]) -> dict[str, Any]:
    """The episodes.parquet row of a job whose reset failed: aborted before its first turn."""
    return {
        "run_id": extra.get("run_id"), "policy_version": extra.get("policy_version"),
        "env_name": slot.env.name, "task": job.task, "episode_id": job.episode_id,
        "episode_seed": job.seed, "success": False, "return": 0.0, "env_return": 0.0,
        "length": 0, "valid_actions": 0, "valid_action_ratio": 0.0, "terminated": False,
        "truncated": False, "aborted": True, "termination": reason,
    }


class _EpisodeQueue:
    """The eval jobs and the slots that play them: one env per slot index, rebuilt only when the
    slot's next job is of another task; new envs start together, resets run in parallel.

    A job already played (`finished`: episode id → its number of turns, from an evaluation's
    journal) takes its slot for that many lock-steps without an env or a generation, so the jobs
    still to play start in the slot and at the step they would have had in one uninterrupted run."""

    def __init__(self, env_factory: Callable[[str], TextEnv], jobs: list[EpisodeJob],
                 settings: AgentSettings, extra: dict[str, Any], bar: Any,
                 finished: dict[str, int], on_episode: Callable[..., None] | None):
        self.env_factory, self.settings, self.extra, self.bar = env_factory, settings, extra, bar
        self.finished, self.on_episode = finished, on_episode
        self.pending = list(reversed(jobs))
        self.slots: dict[int, EnvSlot] = {}
        self.tasks: dict[int, str] = {}
        self.active: dict[int, EnvSlot] = {}
        self.replayed: dict[int, int] = {}  # slot → lock-steps left of a finished job
        self.episodes: list[dict[str, Any]] = []

    def assign(self, free: list[int]) -> None:
        """The next jobs into these free slots; a job whose reset fails is recorded as an aborted
        episode and its slot takes the job after it (so does a finished job of no turns)."""
        while free and self.pending:
            batch = [(index, self.pending.pop()) for index in free[:len(self.pending)]]
            to_play = [(index, job) for index, job in batch if job.episode_id not in self.finished]
            fresh = {index: self.env_factory(job.task) for index, job in to_play
                     if self.tasks.get(index) != job.task}
            for index, env in fresh.items():
                if index in self.slots:
                    self.slots[index].env.close()
                self.slots[index] = EnvSlot(env, index, self.settings)
            for index, job in to_play:
                self.tasks[index] = job.task
                self.slots[index].begin_start(job.seed, job.episode_id)
            free = []
            for index, job in batch:  # in batch order: the order the free slots take new jobs
                if job.episode_id in self.finished:
                    self.bar.update(1)
                    if self.finished[job.episode_id] > 0:
                        self.replayed[index] = self.finished[job.episode_id]
                    else:
                        free.append(index)
                    continue
                failure = self.slots[index].finish_start()
                if failure is None:
                    self.active[index] = self.slots[index]
                    continue
                self.ended(unstarted_episode(self.slots[index], job, failure.reason, self.extra),
                           [])
                free.append(index)

    def ended(self, episode: dict[str, Any], turns: list[dict[str, Any]]) -> None:
        self.episodes.append(episode)
        self.bar.update(1)
        if self.on_episode is not None:
            self.on_episode(episode, turns)

    def tick(self) -> list[int]:
        """One lock-step of the finished jobs; the slots whose job ends with it."""
        for index in self.replayed:
            self.replayed[index] -= 1
        done = [index for index, left in self.replayed.items() if left == 0]
        for index in done:
            del self.replayed[index]
        return done

    def close(self) -> None:
        for slot in self.slots.values():
            slot.env.close()


def episode_sampling(sampling: SamplingParams, slots: list[EnvSlot]) -> SamplingParams:
    """One seed per prompt, from the run's seed, the slot's episode id and its turn: an episode
    samples the same whichever episodes share its lock-step, so a resumed evaluation replays
    exactly what an uninterrupted one would have played."""
    if sampling.seed is None:
        return sampling
    seeds = tuple(row_seed(keyed_seed(int(sampling.seed), slot.episode_id), slot.turn)
                  for slot in slots)
    return dataclasses.replace(sampling, seed=seeds)


def play_episodes(
    engine: Engine, tokenizer: Any, env_factory: Callable[[str], TextEnv], jobs: list[EpisodeJob],
    parallel_envs: int, sampling: SamplingParams, settings: AgentSettings,
    extra: dict[str, Any] | None = None, progress: bool = True,
    finished: dict[str, int] | None = None,
    on_episode: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Play every job to its end with up to `parallel_envs` envs in lock-step.

    Returns (turn rows, episode rows) of the jobs played here; an episode whose env failed is in
    both, `aborted`. Each episode's sampling seeds depend only on the run's seed, its id and the
    turn, so the same jobs, params and seed give the same episodes. Jobs in `finished` (episode
    id → turns) are not played but keep their slot for as many lock-steps, so every other job
    gets the slot and steps it gets in an uninterrupted run. `on_episode(episode, turns)` is
    called as each episode ends (an evaluation's journal); the turn rows then go only there, not
    into the returned list as well (an evaluation's rows need not be held twice).
    """
    extra = extra or {}
    bar = tqdm(total=len(jobs), desc="episodes", unit="ep", disable=not progress)
    queue = _EpisodeQueue(env_factory, jobs, settings, extra, bar, finished or {}, on_episode)
    episode_rows: dict[str, list[dict[str, Any]]] = {}
    turns, step = [], 0
    try:
        queue.assign(list(range(min(parallel_envs, len(jobs)))))
        while queue.active or queue.replayed:
            order = sorted(queue.active)
            slots = [queue.active[i] for i in order]
            rows = generate_turns(engine, tokenizer, slots, episode_sampling(sampling, slots)) \
                if slots else []
            ended = []
            for index, row in zip(order, rows):
                done = row.pop("done")
                row.update(extra, step=step, segment_end=None)  # no segments in evaluation
                if on_episode is None:
                    turns.append(row)
                episode_rows.setdefault(row["episode_id"], []).append(row)
                if done:
                    played = episode_rows.pop(row["episode_id"])
                    queue.ended(summarise_episode(played), played)
                    del queue.active[index]
                    ended.append(index)
            queue.assign(sorted(ended + queue.tick()))
            step += 1
    finally:
        bar.close()
        queue.close()
    return turns, queue.episodes


def env_factory_from_params(params: Params) -> Callable[[str], TextEnv]:
    """task name → a new env of the configured family with the configured kwargs: in its own
    worker process (`env.workers`, with `env.step_timeout_s`) or in this one."""
    e = params.env

    def factory(task: str) -> TextEnv:
        spec = EnvSpec(e.name, task, dict(e.kwargs))
        if e.workers:
            from longturn.envs.workers import WorkerEnv

            return WorkerEnv(spec, e.step_timeout_s)  # type: ignore[return-value]
        return LocalEnv(spec.build(), spec)  # type: ignore[return-value]

    return factory
