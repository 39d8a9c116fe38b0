"""A longturn text env as a task of the chat protocol, its rendered frames as image observations.

The episode is one conversation: the system prompt lists the env's actions, each user turn is an
observation (an `<image>` line for the frame, then the env's text and the answer format), each
reply's `ACTION:` is one env step. `EnvInteraction` steps the env and answers with the next
observation (`envs.base.Observation`, whose frame the rollout buffers), ending the episode when
the env does (on the env's time limit as truncated, bootstrapped like an env slot's time limit);
an unreadable action runs the env's default action and costs `invalid_penalty`, as in env
slots. `reward` and `success` replay the replies on a fresh env of the same seed, so they
need nothing but the conversation.

Built in: `babyai_goto_frames` (BabyAI goto with frames) and `babyai_goto_text` (the same task,
text only). Any other env and task: `EnvTask("crafter", "default")` in a module of yours, named
in `env.tasks` as `package.module:OBJECT`. Needs a vision-language model when `image` is on
(docs/image-observations.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from longturn.agent.prompts import EMPTY_VIEW, answer_format, system_prompt
from longturn.envs.actions import ActionTranslator
from longturn.envs.base import Instructions, Observation, TextEnv
from longturn.envs.registry import make_env
from longturn.tasks.interactions import BaseInteraction
from longturn.vision.encoder import IMAGE_PLACEHOLDER


def _env(env: str, task: str, image: bool) -> TextEnv:
    return make_env(env, task, **({"image": True} if image else {}))


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

    def record(self, seed: int) -> dict[str, Any]:
        env = _env(self.env, self.task, self.image)
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
                                   "image": self.image},
        }

    def replay(self, record: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[float, bool]:
        """(env reward summed, whether the env ended with a positive reward) of the replies."""
        env = _env(self.env, self.task, False)
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
    """Steps the episode's env with each reply's action; config: `invalid_penalty` (default
    0.1), subtracted when a reply names no valid action."""

    def start(self, instance_id: str, **kwargs: Any) -> None:
        env = _env(kwargs["env"], kwargs["task"], bool(kwargs.get("image", True)))
        env.reset(seed=int(kwargs["seed"]))
        self.instances[instance_id] = {
            "env": env, "image": bool(kwargs.get("image", True)),
            "translator": ActionTranslator(env.actions, env.synonyms, env.default_action)}

    def generate_response(self, instance_id: str, messages: list[dict[str, Any]]
                          ) -> tuple[bool, Observation, float, dict[str, Any]]:
        state = self.instances[instance_id]
        env = state["env"]
        parsed = state["translator"].parse(messages[-1]["content"])
        observation, reward, terminated, truncated, _ = env.step(parsed.action)
        penalty = 0.0 if parsed.valid else float(self.config.get("invalid_penalty", 0.1))
        # the rollout writes the frame's <image> line itself (rollout/conversation_rollout.py: _user_message)
        answer = Observation(observation_text(env.instructions, observation, False),
                             observation.image if state["image"] else None)
        metrics = {"env_reward": reward, "invalid_actions": float(not parsed.valid)}
        state["truncated"] = truncated and not terminated
        return terminated or truncated, answer, reward - penalty, metrics

    def truncated(self, instance_id: str) -> bool:
        return bool(self.instances[instance_id].get("truncated"))

    def finalize(self, instance_id: str) -> None:
        state = self.instances.pop(instance_id, None)
        if state is not None:
            state["env"].close()


BABYAI_GOTO_FRAMES = EnvTask("babyai", "goto", image=True)
BABYAI_GOTO_TEXT = EnvTask("babyai", "goto", image=False)
