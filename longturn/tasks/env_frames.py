"""A longturn text env as a task of the chat protocol, its rendered frames as image observations.

The episode is one conversation: the system prompt lists the env's actions, each user turn is an
observation (an `<image>` line for the frame, then the env's text and the answer format), each
reply's `ACTION:` is one env step. `EnvInteraction` steps the env and answers with the next
observation (`envs.base.Observation`, whose frame the rollout buffers), ending the episode when
the env does (on the env's time limit as truncated, bootstrapped like an env slot's time limit);
an unreadable action runs the env's default action and costs `invalid_penalty`, as in env
slots. An env that raises, dies or hangs costs its episode alone, aborted as in env slots (the
interaction's config: `workers`, `step_timeout_s`, `max_retries`). The interaction also says
whether the episode succeeded (the env's `success`, as env slots count it). Where no
`EnvInteraction` played the episode (an agent's, a rollout function's), the task's `reward` and
`success` replay its replies on a fresh env of the same seed, in this process.

Built in: `babyai_goto_frames` (BabyAI goto with frames) and `babyai_goto_text` (the same task,
text only). Any other env and task: `EnvTask("crafter", "default")` in a module of yours, named
in `env.tasks` as `package.module:OBJECT`. Needs a vision-language model when `image` is on
(docs/image-observations.md).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from longturn.agent.prompts import EMPTY_VIEW, answer_format, system_prompt
from longturn.envs.actions import ActionTranslator
from longturn.envs.base import Instructions, Observation, TextEnv
from longturn.envs.failures import EnvFailure, restart_or_give_up
from longturn.envs.local import LocalEnv
from longturn.envs.registry import EnvSpec, make_env
from longturn.envs.workers import WorkerEnv
from longturn.tasks.interactions import BaseInteraction
from longturn.vision.encoder import IMAGE_PLACEHOLDER


def _env(env: str, task: str, image: bool, kwargs: dict[str, Any]) -> TextEnv:
    return make_env(env, task, **kwargs, **({"image": True} if image else {}))


def observation_text(instructions: Instructions, observation: Observation, image: bool) -> str:
    """One user turn: the frame's placeholder (with images), the goal, the text view and the
    answer format."""
    view = observation.text if observation.text.strip() else EMPTY_VIEW
    lines = [IMAGE_PLACEHOLDER] if image else []
    lines += [f"Your goal: {instructions.goal}.", f"Current observation:\n{view}", "",
              answer_format(instructions)]
    return "\n".join(lines)


def _replies(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "assistant"]


@dataclass(frozen=True)
class EnvTask:
    """`env.tasks` entry playing `task` of env `env` (a built-in name or a plugin factory)."""

    env: str
    task: str
    image: bool = True
    kwargs: dict[str, Any] = field(default_factory=dict)  # the env's constructor's, as env.kwargs

    def record(self, seed: int) -> dict[str, Any]:
        env = _env(self.env, self.task, self.image, self.kwargs)
        try:
            observation, _ = env.reset(seed=seed)
            instructions = env.instructions
        finally:
            env.close()
        if self.image and observation.image is None:
            raise ValueError(f"env {self.env!r} task {self.task!r} returned no frame with "
                             "image on")
        return {
            "messages": [{"role": "system", "content": system_prompt(instructions)},
                         {"role": "user",
                          "content": observation_text(instructions, observation, self.image)}],
            "images": [observation.image] if self.image else [],
            "interaction_kwargs": {"env": self.env, "task": self.task, "seed": int(seed),
                                   "image": self.image,
                                   **({"env_kwargs": dict(self.kwargs)} if self.kwargs else {})},
        }

    def replay(self, record: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[float, bool]:
        """(env reward summed, whether the env ended with a positive reward) of the replies: for
        an episode no `EnvInteraction` played, which would have said."""
        env = _env(self.env, self.task, False, self.kwargs)
        translator = ActionTranslator(env.actions, env.synonyms, env.default_action)
        total, reward, ended = 0.0, 0.0, False
        try:
            env.reset(seed=int(record["interaction_kwargs"]["seed"]))
            for reply in _replies(messages):
                _, reward, terminated, truncated, _ = env.step(translator.parse(reply).action)
                total += reward
                if terminated or truncated:
                    ended = True
                    break
        finally:
            env.close()
        return total, ended and reward > 0

    def reward(self, record: dict[str, Any], messages: list[dict[str, Any]]) -> float:
        return self.replay(record, messages)[0]

    def success(self, record: dict[str, Any], messages: list[dict[str, Any]]) -> bool:
        return self.replay(record, messages)[1]


class EnvInteraction(BaseInteraction):
    """Steps the episode's env with each reply's action.

    config: `invalid_penalty` (0.1), subtracted when a reply names no valid action; `workers`
    (false): each env in a worker process of its own, as env slots with `env.workers`;
    `step_timeout_s` (30, with workers; under `rollout.chat.tool_timeout_s`, which bounds the
    whole call): a reset or step that takes longer is cut off;
    `max_retries` (3). An env that raises, dies or hangs aborts its episode alone, as in env slots:
    `generate_response` raises the `EnvFailure`, the rollout ends the episode as aborted (out of
    the loss, counted by its reason) and the env is restarted; more than `max_retries` failures
    in a row stop the stage (`EnvGaveUp`). An env is kept when its episode ends and reset for a
    later one of the same env and task, so a worker process is started once per running episode,
    not once per episode."""

    def __init__(self, config: dict[str, Any], name: str):
        super().__init__(config, name)
        self._idle: dict[str, list[Any]] = {}  # idle envs by their spec's repr
        self._lock = threading.Lock()  # the rollout calls episodes' methods on several threads
        self._failures_in_a_row = 0

    def _spec(self, kwargs: dict[str, Any]) -> EnvSpec:
        image = {"image": True} if kwargs.get("image", True) else {}
        return EnvSpec(kwargs["env"], kwargs["task"], {**(kwargs.get("env_kwargs") or {}), **image})

    def _take(self, spec: EnvSpec) -> Any:
        """An idle env of this spec, or a new one (in a worker process with `workers`)."""
        with self._lock:
            idle = self._idle.get(repr(spec))
            if idle:
                return idle.pop()
        if self.config.get("workers", False):
            return WorkerEnv(spec, self.config.get("step_timeout_s", 30.0),
                             f"the {self.name!r} interaction's step_timeout_s")
        return LocalEnv(spec.build(), spec)

    def _failed(self, env: Any, failure: EnvFailure, call: str, seed: int) -> None:
        """Restart the env; past `max_retries` failures in a row, stop the stage."""
        with self._lock:
            self._failures_in_a_row += 1
            failures = self._failures_in_a_row
        restart_or_give_up(env, failure, name=env.spec.name, task=env.spec.task, call=call,
                           seed=seed, failures=failures,
                           limit=int(self.config.get("max_retries", 3)),
                           setting=f"the {self.name!r} interaction's max_retries")

    def _succeeded(self) -> None:
        with self._lock:
            self._failures_in_a_row = 0

    def start(self, instance_id: str, **kwargs: Any) -> None:
        """Reset an env for the episode; a failed reset is retried on a restarted env (the
        task record's own reset of this seed has already worked), up to `max_retries` times."""
        spec, seed = self._spec(kwargs), int(kwargs["seed"])
        env = self._take(spec)
        while True:
            try:
                env.submit_reset(seed)
                env.wait_reset()
                break
            except EnvFailure as failure:
                self._failed(env, failure, "reset", seed)
        self._succeeded()
        self.instances[instance_id] = {
            "env": env, "spec": spec, "seed": seed, "image": bool(kwargs.get("image", True)),
            "translator": ActionTranslator(env.actions, env.synonyms, env.default_action)}

    def generate_response(self, instance_id: str, messages: list[dict[str, Any]]
                          ) -> tuple[bool, Observation, float, dict[str, Any]]:
        state = self.instances[instance_id]
        env = state["env"]
        parsed = state["translator"].parse(messages[-1]["content"])
        try:
            env.submit_step(parsed.action)
            observation, reward, terminated, truncated, info = env.wait_step()
        except EnvFailure as failure:
            self._failed(env, failure, "step", state["seed"])
            raise
        self._succeeded()
        penalty = 0.0 if parsed.valid else float(self.config.get("invalid_penalty", 0.1))
        # the rollout writes the frame's <image> line itself (conversation_rollout: _user_message)
        answer = Observation(observation_text(env.instructions, observation, False),
                             observation.image if state["image"] else None)
        metrics = {"env_reward": reward, "invalid_actions": float(not parsed.valid)}
        state["truncated"] = truncated and not terminated
        state["success"] = bool(info.get("success", False))  # as an env slot's turn row
        return terminated or truncated, answer, reward - penalty, metrics

    def truncated(self, instance_id: str) -> bool:
        return bool(self.instances[instance_id].get("truncated"))

    def succeeded(self, instance_id: str) -> bool:
        """The env's `success` on the episode's last step (False before any), as env slots
        count it: known here, so the task need not replay the episode."""
        return bool(self.instances[instance_id].get("success"))

    def finalize(self, instance_id: str) -> None:
        """The episode's env goes back to the idle ones, for a later episode to reset."""
        state = self.instances.pop(instance_id, None)
        if state is not None:
            with self._lock:
                self._idle.setdefault(repr(state["spec"]), []).append(state["env"])


BABYAI_GOTO_FRAMES = EnvTask("babyai", "goto", image=True)
BABYAI_GOTO_TEXT = EnvTask("babyai", "goto", image=False)
