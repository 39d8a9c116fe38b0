"""Vectorised env stepping: many env slots advance in lock-step with one batched generation.

`EnvSlot` owns one environment and the agent's view of its current episode (history window, turn
counter, episode id); it renders the next prompt and applies a completion, producing one turn row of
the Parquet contract. `play_episodes` runs a queue of (task, seed) episodes to completion (eval).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Callable

from tqdm.auto import tqdm

from longturn.agent.memory import HistoryWindow
from longturn.agent.prompts import Prompt, build_prompt, history_reply
from longturn.config import Params
from longturn.engines.base import Completion, Engine, SamplingParams
from longturn.envs.base import TextEnv
from longturn.envs.registry import make_env, translator_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentSettings:
    """How an agent turns env output into prompts and model output into actions."""

    history_turns: int = 1
    history_content: str = "output"
    invalid_in_history: str = "default_action"
    max_prompt_tokens: int = 1024
    demonstration: bool = True
    invalid_action_penalty: float = 0.1
    max_turns: int | None = None

    @classmethod
    def from_params(cls, params: Params) -> "AgentSettings":
        p, e = params.prompt, params.env
        return cls(p.history_turns, p.history_content, p.invalid_in_history, p.max_prompt_tokens,
                   p.demonstration, e.invalid_action_penalty, e.max_turns)


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to play: which task, which reset seed, which id."""

    task: str
    seed: int
    episode_id: str


class EnvSlot:
    """One environment slot and the agent's state for the episode running in it."""

    def __init__(self, env: TextEnv, env_index: int, settings: AgentSettings):
        self.env = env
        self.env_index = env_index
        self.settings = settings
        self.translator = translator_for(env)
        self.history = HistoryWindow(settings.history_turns)
        self.episode_id = ""
        self.seed = 0
        self.turn = 0
        self.observation = ""

    def start(self, seed: int, episode_id: str) -> None:
        obs, _ = self.env.reset(seed=seed)
        self.history.clear()
        self.episode_id, self.seed, self.turn, self.observation = episode_id, seed, 0, obs.text

    def prompt(self, tokenizer: Any) -> Prompt:
        return build_prompt(tokenizer, self.env.instructions, self.history.entries(),
                            self.observation, self.settings.max_prompt_tokens,
                            self.settings.demonstration)

    def apply(self, prompt: Prompt, completion: Completion, response_text: str) -> dict[str, Any]:
        """Execute the parsed action; return the turn row. `row['done']` says the episode ended."""
        parsed = self.translator.parse(response_text)
        row = self._base_row(prompt, completion, response_text, parsed)
        try:
            obs, env_reward, terminated, truncated, info = self.env.step(parsed.action)
        except Exception:  # an env bug must not kill a long run: drop the episode, keep going
            log.exception("env %s/%s failed on seed %s turn %s; episode aborted",
                          self.env.name, self.env.task, self.seed, self.turn)
            row.update(env_reward=0.0, reward=0.0, terminated=False, truncated=False,
                       success=False, aborted=True, done=True)
            return row
        if self.settings.max_turns and self.turn + 1 >= self.settings.max_turns:
            truncated = True
        penalty = 0.0 if parsed.valid else self.settings.invalid_action_penalty
        row.update(env_reward=float(env_reward), reward=float(env_reward) - penalty,
                   terminated=bool(terminated), truncated=bool(truncated) and not terminated,
                   success=bool(info.get("success", False)), aborted=False,
                   done=bool(terminated or truncated))
        s = self.settings
        reply = history_reply(response_text, parsed.action, parsed.valid,
                              s.history_content, s.invalid_in_history)  # type: ignore[arg-type]
        self.history.add(self.observation, reply)
        self.observation = obs.text
        self.turn += 1
        return row

    def _base_row(self, prompt: Prompt, completion: Completion, text: str, parsed) -> dict[str, Any]:
        return {
            "env_index": self.env_index, "env_name": self.env.name, "task": self.env.task,
            "episode_id": self.episode_id, "episode_seed": self.seed, "turn": self.turn,
            "prompt_ids": prompt.ids, "response_ids": completion.token_ids,
            "prompt_text": prompt.text, "response_text": text,
            "raw_action": parsed.raw_action, "action": parsed.action,
            "action_valid": parsed.valid, "action_failure": parsed.failure,
            "finish_reason": completion.finish_reason, "history_dropped": prompt.history_dropped,
            "engine_logprobs": completion.logprobs,
        }


def generate_turns(engine: Engine, tokenizer: Any, slots: list[EnvSlot],
                   sampling: SamplingParams) -> list[dict[str, Any]]:
    """One lock-step: render every slot's prompt, generate in one batch, apply each completion."""
    prompts = [slot.prompt(tokenizer) for slot in slots]
    completions = engine.generate([p.ids for p in prompts], sampling)
    rows = []
    for slot, prompt, completion in zip(slots, prompts, completions):
        text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        rows.append(slot.apply(prompt, completion, text))
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
        "aborted": bool(last["aborted"]),
    }


def play_episodes(
    engine: Engine, tokenizer: Any, env_factory: Callable[[str], TextEnv], jobs: list[EpisodeJob],
    parallel_envs: int, sampling: SamplingParams, settings: AgentSettings,
    extra: dict[str, Any] | None = None, progress: bool = True,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Play every job to its end with up to `parallel_envs` envs in lock-step.

    Returns (turn rows, episode rows). The engine seed advances with the lock-step counter, so the
    same jobs, params and seed give the same episodes.
    """
    extra = extra or {}
    pending = list(reversed(jobs))
    envs: dict[tuple[int, str], TextEnv] = {}
    active: dict[int, EnvSlot] = {}
    episode_rows: dict[str, list[dict[str, Any]]] = {}
    turns, episodes, step = [], [], 0
    bar = tqdm(total=len(jobs), desc="episodes", unit="ep", disable=not progress)

    def fill(index: int) -> None:
        job = pending.pop()
        env = envs.setdefault((index, job.task), env_factory(job.task))
        slot = EnvSlot(env, index, settings)
        slot.start(job.seed, job.episode_id)
        active[index] = slot

    for index in range(min(parallel_envs, len(pending))):
        fill(index)
    while active:
        order = sorted(active)
        step_sampling = dataclasses.replace(
            sampling, seed=None if sampling.seed is None else sampling.seed + step)
        rows = generate_turns(engine, tokenizer, [active[i] for i in order], step_sampling)
        for index, row in zip(order, rows):
            done = row.pop("done")
            row.update(extra, step=step, segment_end=None)  # no segments in evaluation
            turns.append(row)
            episode_rows.setdefault(row["episode_id"], []).append(row)
            if done:
                episodes.append(summarise_episode(episode_rows.pop(row["episode_id"])))
                bar.update(1)
                del active[index]
                if pending:
                    fill(index)
        step += 1
    bar.close()
    for env in envs.values():
        env.close()
    return turns, episodes


def env_factory_from_params(params: Params) -> Callable[[str], TextEnv]:
    """task name → a new env of the configured family with the configured kwargs."""
    return lambda task: make_env(params.env.name, task, **params.env.kwargs)
