"""Vectorised env stepping: many env slots advance in lock-step with one batched generation.

`EnvSlot` owns one environment and the agent's view of its current episode (history window, turn
counter, episode id); it renders the next prompt and applies a completion, producing one turn row of
the Parquet contract. `generate_turns` is one lock-step of many slots; rollout/env_player.py plays
slots in the train loop's batches and in an evaluation's list of episodes.

Env calls are split into submit and wait (`longturn/envs/local.py`, `workers.py`): a lock-step sends
every slot's action first, then reads the results in slot order and renders each slot's next
prompt as soon as its result is in, while envs in worker processes are still stepping. An env that
raises, dies or hangs past `env.step_timeout_s` aborts its episode (`aborted`, out of the loss,
counted by termination reason) and is restarted; more than `env.max_retries` failures of one slot
in a row stop the stage (`EnvGaveUp`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from longturn.agent.memory import HistoryWindow, PastTurn
from longturn.agent.prompts import ActionPrompt, ActionView, Prompt
from longturn.params.config import Params
from longturn.engines.base import (Completion, Engine, SamplingParams, engine_image_token,
                                   generate_with_frames)
from longturn.envs.actions import ParsedAction
from longturn.envs.base import TextEnv
from longturn.envs.failures import EnvFailure, restart_or_give_up
from longturn.envs.local import LocalEnv, managed
from longturn.envs.registry import EnvSpec, translator_for
from longturn.envs.termination import reason_of
from longturn.rollout.samples import sample_from_turn
from longturn.vision.frames import to_png


@dataclass(frozen=True)
class AgentSettings:
    """How an agent turns env output into prompts and model output into actions, and how many env
    failures in a row one slot survives. No defaults of its own: `from_params` reads the prompt
    and env sections, the one place defaults live."""

    history_turns: int | None  # None: every past turn (rollout.context episode)
    prompt: ActionPrompt  # how the past is shown (a conversation of an env shows it so too)
    invalid_action_penalty: float
    max_turns: int | None
    max_retries: int

    @classmethod
    def from_params(cls, params: Params) -> "AgentSettings":
        p, e = params.prompt, params.env
        return cls(history_turns=params.history_window, prompt=ActionPrompt.from_config(p),
                   invalid_action_penalty=e.invalid_action_penalty, max_turns=e.max_turns,
                   max_retries=e.max_retries)


class EnvSlot:
    """One environment slot and the agent's state for the episode running in it."""

    frame: Any = None  # also what a slot pickled before frames existed (a checkpoint) reads

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
        self.frame = None  # the current observation's image (an env built with image: true)
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
        self.turn, self.observation, self.frame, self._prompt = 0, obs.text, obs.image, None
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
        restart_or_give_up(self.env, failure, name=self.env.name, task=self.env.task, call=call,
                           seed=self.seed, failures=self.failures,
                           limit=self.settings.max_retries, setting="env.max_retries",
                           turn=self.turn)

    # ------------------------------------------------------------------ turns

    def prompt(self, tokenizer: Any, image_token: tuple[int, int] | None = None) -> Prompt:
        """The prompt of the current observation (rendered once per state); with the
        observation's frame when the env gives one (`image_token`: the engine's image
        placeholder, `engine.vision.placeholder`)."""
        if self._prompt is None or self._prompt[0] is not tokenizer:
            view = ActionView(self.env.instructions, self.history.entries(), self.observation,
                              self.frame)  # the window keeps the last history_turns turns
            prompt = self.settings.prompt.render(tokenizer, view, None, image_token)
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
        self.history.add(PastTurn(self.observation, response_text, parsed.action, parsed.valid))
        self.observation, self.frame = obs.text, obs.image
        self.turn += 1
        self._prompt = None
        return row

    def apply(self, prompt: Prompt, completion: Completion, response_text: str) -> dict[str, Any]:
        """Execute the parsed action; return the turn row. `row['done']` says the episode ended."""
        self.send(prompt, completion, response_text)
        return self.receive()

    def _base_row(self, prompt: Prompt, completion: Completion, text: str,
                  parsed: ParsedAction) -> dict[str, Any]:
        return {"env_index": self.env_index, "env_name": self.env.name, "task": self.env.task,
                "episode_id": self.episode_id, "episode_seed": self.seed, "turn": self.turn,
                **_reply_columns(prompt, completion, text, parsed),
                "observation": self.observation}


def _reply_columns(prompt: Prompt, completion: Completion, text: str,
                   parsed: ParsedAction) -> dict[str, Any]:
    """A turn row's columns of what the model was given and replied, and how it parsed (and the
    prompt's frame, when it has one)."""
    frames = prompt_frames(prompt)
    return {**frames, "prompt_ids": prompt.ids, "response_ids": completion.token_ids,
            "prompt_text": prompt.text, "response_text": text,
            "raw_action": parsed.raw_action, "action": parsed.action,
            "action_valid": parsed.valid, "action_failure": parsed.failure,
            "finish_reason": completion.finish_reason, "history_dropped": prompt.history_dropped,
            "engine_logprobs": completion.logprobs}


def prompt_frames(prompt: Prompt, prefix: str = "") -> dict[str, Any]:
    """A prompt's frames as a row's `images` (PNG) and `image_starts` ({} without frames)."""
    if not prompt.frames:
        return {}
    return {f"{prefix}images": [to_png(frame) for frame in prompt.frames],
            f"{prefix}image_starts": list(prompt.image_starts)}


def unplayed_first_turn(env: TextEnv, seed: int, episode_id: str, prompt: Prompt,
                        completion: Completion, text: str, parsed: ParsedAction) -> dict[str, Any]:
    """A first reply the env never stepped (prompt validation's) as a sample of the one schema:
    no reward, nothing ended."""
    return sample_from_turn({"env_name": env.name, "task": env.task, "episode_id": episode_id,
                             "episode_seed": seed, "turn": 0, "step": 0,
                             **_reply_columns(prompt, completion, text, parsed)})


def generate_turns(engine: Engine, tokenizer: Any, slots: list[EnvSlot],
                   sampling: SamplingParams) -> list[dict[str, Any]]:
    """One lock-step: every slot's prompt, one batched generation, every action sent to its env,
    then each result read in slot order, the slot's next prompt rendered while later envs step."""
    image_token = engine_image_token(engine)
    prompts = [slot.prompt(tokenizer, image_token) for slot in slots]
    completions = generate(engine, prompts, sampling)
    for slot, prompt, completion in zip(slots, prompts, completions):
        slot.send(prompt, completion, tokenizer.decode(completion.token_ids,
                                                       skip_special_tokens=True))
    rows = []
    for slot in slots:
        row = slot.receive()
        if not row["done"]:
            slot.prompt(tokenizer, image_token)
        rows.append(row)
    return rows


def generate(engine: Engine, prompts: list[Prompt], sampling: SamplingParams) -> list[Completion]:
    """One batched generation of these prompts, with their frames."""
    return generate_with_frames(engine, [p.ids for p in prompts],
                                [list(zip(p.image_starts, p.frames)) for p in prompts], sampling)


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
