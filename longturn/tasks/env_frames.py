"""A longturn text env as a task of conversations, its rendered frames as image observations: how
the action protocol plays every env (`ConversationRun.of_env`), and an env task of the chat
protocol (`configs/env_interactions.yaml`).

The episode is one conversation: the system prompt lists the env's actions, each user turn is an
observation (an `<image>` line for the frame, then the env's text and the answer format), each
reply's `ACTION:` is one env step. Everything about the env happens in `EnvInteraction` (in the
env's worker process with `env.workers`): the task record only says which env, task and seed, so
no env is built in the trainer's process. Played without this interaction (an agent, no
interaction) an env task stops with one line.

Built in: `babyai_goto_frames` (BabyAI goto with frames) and `babyai_goto_text` (the same task,
text only). Any other env and task: `EnvTask("crafter", "default")` in a module of yours, named
in `env.tasks` as `package.module:OBJECT`. Needs a vision-language model when `image` is on
(docs/image-observations.md; the env's settings and failures: docs/environments.md).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from longturn.agent.memory import PastTurn
from longturn.agent.prompts import ActionView, current_turn, system_prompt
from longturn.envs.actions import ParsedAction
from longturn.envs.base import Instructions, Observation
from longturn.envs.failures import EnvFailure, restart_or_give_up
from longturn.envs.local import LocalEnv
from longturn.envs.registry import EnvSpec, translator_for
from longturn.envs.workers import WorkerEnv
from longturn.errors import SettingError
from longturn.tasks.interactions import BaseInteraction
from longturn.vision.encoder import IMAGE_PLACEHOLDER


def observation_text(instructions: Instructions, observation: Observation, image: bool) -> str:
    """One user turn: the frame's placeholder (with images), then the turn the action prompt
    ends with (the goal, the text view, the answer format)."""
    turn = current_turn(instructions, instructions.goal, observation.text)
    return f"{IMAGE_PLACEHOLDER}\n{turn}" if image else turn


@dataclass(frozen=True)
class EnvTask:
    """`env.tasks` entry playing `task` of env `env` (a built-in name or a plugin factory)."""

    opened_by_interaction = True  # its record has no messages (ConversationRun checks)
    env: str
    task: str
    image: bool = True
    kwargs: dict[str, Any] = field(default_factory=dict)  # the env's constructor's, as env.kwargs

    def record(self, seed: int) -> dict[str, Any]:
        """What the interaction needs to reset the env; no messages: the `EnvInteraction`
        opens the episode from the env it resets (its instructions and first observation), so
        no env is built here, in the trainer's process."""
        return {"messages": [], "images": [], "env_name": self.env,
                "interaction_kwargs": {"env": self.env, "task": self.task, "seed": int(seed),
                                       "image": self.image,
                                       **({"env_kwargs": dict(self.kwargs)} if self.kwargs
                                          else {})}}

    def reward(self, record: dict[str, Any], messages: list[dict[str, Any]]) -> float:
        """Refused, and `success` too: an env task asked to judge its episode itself was played
        wrong; only the env behind `EnvInteraction` knows its reward and success
        (`BaseInteraction.succeeded`)."""
        raise SettingError(f"task {record.get('task', self.env)!r} plays env {self.env!r} "
                           "through EnvInteraction, which scores each reply and says whether the "
                           "episode succeeded: play it with the built-in rollout and "
                           "rollout.chat.interactions: configs/env_interactions.yaml")

    success = reward


class EnvInteraction(BaseInteraction):
    """Resets the episode's env, opens the episode with its first observation, steps it with
    each reply's action and says whether the episode succeeded.

    Its settings are env.*'s (`use_env_settings`; built directly, from `config`, the defaults in
    brackets; docs/environments.md): `invalid_action_penalty` (0.1), for a reply that names no
    valid action; `max_turns` (none), the steps after which the episode is cut as a time limit;
    `workers` (false); `step_timeout_s` (30, with workers); `max_retries` (3). An env that
    raises, dies or hangs aborts its episode alone (`start` or `generate_response` raises the
    `EnvFailure` once the env is restarted); more than `max_retries` failures of one env in a
    row (a reset that works does not clear them, a step does) stop the stage (`EnvGaveUp`). An
    env is kept when its episode ends and reset for a later one of the same env and task, so a
    worker process is started once per running episode, not once per episode."""

    def __init__(self, config: dict[str, Any], name: str):
        super().__init__(config, name)
        self._idle: dict[str, list[Any]] = {}  # idle envs by their spec's repr
        self._lock = threading.Lock()  # the rollout calls episodes' methods on several threads
        # failures in a row of each env (by id: kept here or idle for the interaction's life),
        # a successful step clears it, a reset does not
        self._failures: dict[int, int] = {}
        self._settings_are = f"the {name!r} interaction's "  # where a message says they are set

    def use_env_settings(self, where: str, **settings: Any) -> None:
        """Take the run's env.* settings (`ENV_SETTINGS`), so one setting means one thing for
        either protocol; the interaction's own config must not set them too (`where`: its file)."""
        if self.config:  # every setting it has is env.*'s (an older file's keys among them)
            raise SettingError(f"{where}: interaction {self.name!r} sets "
                               f"{', '.join(sorted(self.config))} in its config; its settings are "
                               f"the run's env.{', env.'.join(settings)}: give it `config: {{}}`")
        self.config.update(settings)
        self._settings_are = "env."

    def _take(self, spec: EnvSpec) -> Any:
        """An idle env of this spec, or a new one (in a worker process with `workers`)."""
        with self._lock:
            idle = self._idle.get(repr(spec))
            if idle:
                return idle.pop()
        if self.config.get("workers", False):
            return WorkerEnv(spec, self.config.get("step_timeout_s", 30.0),
                             f"{self._settings_are}step_timeout_s")
        return LocalEnv(spec.build(), spec)

    def _failed(self, env: Any, failure: EnvFailure, call: str, seed: int, turn: int) -> None:
        """Restart the env; past `max_retries` failures of this env in a row, stop the stage.
        Said with the env's own name, the seed and the episode's turn."""
        with self._lock:
            failures = self._failures[id(env)] = self._failures.get(id(env), 0) + 1
        restart_or_give_up(env, failure, name=env.name, task=env.task, call=call,
                           seed=seed, turn=turn, failures=failures,
                           limit=int(self.config.get("max_retries", 3)),
                           setting=f"{self._settings_are}max_retries")

    def start(self, instance_id: str, **kwargs: Any) -> None:
        """Reset an env for the episode (in its worker process with `workers`). A reset that
        fails raises its `EnvFailure` once the env is restarted (the episode does not begin and
        is counted as an aborted reset), or past `max_retries` failures in a row `EnvGaveUp`."""
        image, seed = bool(kwargs.get("image", True)), int(kwargs["seed"])
        spec = EnvSpec(kwargs["env"], kwargs["task"],
                       {**(kwargs.get("env_kwargs") or {}), **({"image": True} if image else {})})
        env = self._take(spec)
        try:
            env.submit_reset(seed)
            observation, _ = env.wait_reset()
        except EnvFailure as failure:
            self._failed(env, failure, "reset", seed, 0)
            self._give_back(spec, env)
            raise
        if image and observation.image is None:
            raise SettingError(f"env {spec.name!r} task {spec.task!r} returned no frame with "
                               "image on")
        instructions = env.instructions
        self.instances[instance_id] = {
            "env": env, "spec": spec, "seed": seed, "image": image, "observation": observation,
            "past": [],  # the episode's steps (PastTurn), for `action_view`
            "translator": translator_for(env),  # a gymnasium Text space: free text
            "opening": ([{"role": "system", "content": system_prompt(instructions)},
                         {"role": "user",
                          "content": observation_text(instructions, observation, image)}],
                        [observation.image] if image else [])}

    def opening(self, instance_id: str) -> tuple[list[dict[str, Any]], list[Any]]:
        """The env's instructions as the system message and its first observation (with its
        frame), from the reset in `start`; handed over once."""
        return self.instances[instance_id].pop("opening")

    def generate_response(self, instance_id: str, messages: list[dict[str, Any]]
                          ) -> tuple[bool, Observation, float, dict[str, Any]]:
        state = self.instances[instance_id]
        env = state["env"]
        parsed = state["translator"].parse(messages[-1]["content"])
        try:
            env.submit_step(parsed.action)
            observation, reward, terminated, truncated, info = env.wait_step()
        except EnvFailure as failure:
            self._failed(env, failure, "step", state["seed"], len(state["past"]))
            raise
        with self._lock:
            self._failures.pop(id(env), None)  # a step that works clears the failures in a row
        state["past"].append(PastTurn(state["observation"].text, messages[-1]["content"],
                                      parsed.action, parsed.valid))
        state["observation"] = observation
        penalty = 0.0 if parsed.valid else float(self.config.get("invalid_action_penalty", 0.1))
        # the rollout writes the frame's <image> line itself (conversation_rollout: _user_message)
        answer = Observation(observation_text(env.instructions, observation, False),
                             observation.image if state["image"] else None)
        metrics = {"env_reward": reward, "invalid_actions": float(not parsed.valid)}
        limit = self.config.get("max_turns")
        truncated = truncated or bool(limit and len(state["past"]) >= limit)  # env.max_turns
        state["truncated"] = truncated and not terminated
        state["success"] = bool(info.get("success", False))  # the env's own word
        state["parsed"] = parsed
        return terminated or truncated, answer, reward - penalty, metrics

    def truncated(self, instance_id: str) -> bool:
        return bool(self.instances[instance_id].get("truncated"))

    def succeeded(self, instance_id: str) -> bool:
        """The env's `success` on the episode's last step (False before any): known here, so
        the task need not replay the episode."""
        return bool(self.instances[instance_id].get("success"))

    def read_action(self, instance_id: str) -> ParsedAction:
        """The action the last reply named (or the default one it fell back to), as its sample
        records it."""
        return self.instances[instance_id]["parsed"]

    def action_view(self, instance_id: str) -> ActionView:
        """The episode as the action protocol's prompt shows it: the env's instructions, its
        steps so far, the current observation and (with `image`) its frame."""
        state = self.instances[instance_id]
        observation = state["observation"]
        return ActionView(state["env"].instructions, state["past"], observation.text,
                          observation.image if state["image"] else None)

    def action_names(self) -> list[str]:
        """Every action of the envs built so far (playing or idle), in their own order."""
        with self._lock:
            envs = [s["env"] for s in self.instances.values()] + [
                env for idle in self._idle.values() for env in idle]
        return list(dict.fromkeys(a for env in envs for a in env.actions))

    def finalize(self, instance_id: str) -> None:
        """The episode's env goes back to the idle ones, for a later episode to reset."""
        state = self.instances.pop(instance_id, None)
        if state is not None:
            self._give_back(state["spec"], state["env"])

    def close(self) -> None:
        """Close every env built here, idle or still playing (their worker processes stop): the
        player of its episodes is done with it."""
        with self._lock:
            envs = [s["env"] for s in self.instances.values()] + [
                env for idle in self._idle.values() for env in idle]
            self.instances.clear()
            self._idle.clear()
        for env in envs:
            env.close()

    def _give_back(self, spec: EnvSpec, env: Any) -> None:
        with self._lock:
            self._idle.setdefault(repr(spec), []).append(env)


# the env.* settings an EnvInteraction takes from a run's params (`use_env_settings`)
ENV_SETTINGS = ("workers", "step_timeout_s", "max_retries", "invalid_action_penalty",
                "max_turns")

BABYAI_GOTO_FRAMES = EnvTask("babyai", "goto", image=True)
BABYAI_GOTO_TEXT = EnvTask("babyai", "goto", image=False)
