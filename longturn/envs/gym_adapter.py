"""A plain `gymnasium.Env` as a longturn text env, so `env.name: package.module:Class` needs no
hand-written wrapper.

What the adapter reads from the gymnasium env (attributes of `env.unwrapped`, all optional except
where said):
- actions: a `Discrete` space named by `action_names` (a list), `get_action_meanings()` (the ALE
  convention) or an `actions` Enum (minigrid's); one of them is required. `action_descriptions`
  ({name: text}) and `default_action` (a name; else the first) refine them. A `Text` space takes the
  model's action text as written (`default_action`, else the shortest valid string, runs when the
  text is not in the space).
- observations: a `str`, a dict with a `"text"` string, or `render()` text under
  `render_mode="ansi"`; with `render_mode="rgb_array"` the frame goes to `Observation.image`.
- the goal: `goal` (a string, read after every reset), else the observation's `"mission"`/`"goal"`,
  else the first line of the class docstring; `tips` (a list of strings).
- success: `info["success"]` or `info["is_success"]`.
"""

from __future__ import annotations

import enum
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Discrete, Text

from longturn.envs.base import Instructions, Observation
from longturn.errors import SettingError

FREE_TEXT_LABEL = "<your action, as text>"


def is_gym_env(obj: Any) -> bool:
    """A gymnasium env that is not already a longturn text env."""
    return isinstance(obj, gym.Env) and not hasattr(type(obj), "instructions")


def _discrete_names(env: Any, space: Discrete) -> list[str]:
    if getattr(env, "action_names", None) is not None:
        names = [str(n) for n in env.action_names]
    elif callable(getattr(env, "get_action_meanings", None)):
        names = [str(n) for n in env.get_action_meanings()]
    elif isinstance(getattr(env, "actions", None), type) and issubclass(env.actions, enum.Enum):
        names = [m.name.replace("_", " ").lower() for m in env.actions]
    else:
        raise SettingError(f"gymnasium env {type(env).__name__} has a Discrete({space.n}) action "
                         "space but no action names: give it an `action_names` list (or "
                         "`get_action_meanings()`)")
    if len(names) != space.n or len(set(names)) != len(names):
        raise SettingError(f"gymnasium env {type(env).__name__}: {len(names)} action names "
                         f"{names} for Discrete({space.n}); they must be {space.n} distinct names")
    return names


class GymTextEnv:
    """Wraps one gymnasium env; `name` is the `env.name` it was built from."""

    synonyms: dict[str, str] = {}

    def __init__(self, env: gym.Env, name: str, task: str):
        self.gym_env, self.name, self.task = env, name, task
        core = env.unwrapped
        space = env.action_space
        if isinstance(space, Discrete):
            self.actions = _discrete_names(core, space)
            self._codes = {a: space.start + i for i, a in enumerate(self.actions)}
            self.text_action_space: Text | None = None
            default = getattr(core, "default_action", None) or self.actions[0]
            if default not in self._codes:
                raise SettingError(f"gymnasium env {type(core).__name__}: default_action "
                                 f"{default!r} is not one of {self.actions}")
        elif isinstance(space, Text):
            self.actions, self._codes, self.text_action_space = [], {}, space
            shortest = min(space.character_set) * space.min_length if space.min_length else ""
            default = getattr(core, "default_action", None) or shortest
        else:
            raise SettingError(f"gymnasium env {type(core).__name__}: action space "
                             f"{type(space).__name__} is neither Discrete nor Text")
        self.default_action: str = str(default)
        descriptions = dict(getattr(core, "action_descriptions", None) or {})
        self._shown = ({a: str(descriptions.get(a, a)) for a in self.actions} if self.actions else
                       {FREE_TEXT_LABEL: str(descriptions.get(FREE_TEXT_LABEL, "any text"))})
        self._tips = [str(t) for t in getattr(core, "tips", None) or []]
        doc = (type(core).__doc__ or "").strip().splitlines()
        self._fallback_goal = doc[0].strip().rstrip(".") if doc else "reach the goal"
        self._read_goal(None)

    @property
    def instructions(self) -> Instructions:
        return Instructions(goal=self._goal, actions=self._shown, tips=self._tips)

    def _observation(self, raw: Any) -> Observation:
        env = self.gym_env
        if isinstance(raw, str):
            text = raw
        elif isinstance(raw, dict) and isinstance(raw.get("text"), str):
            text = raw["text"]
        elif env.render_mode == "ansi":
            text = str(env.render())
        else:
            raise SettingError(f"gymnasium env {type(env.unwrapped).__name__}: observation of type "
                             f"{type(raw).__name__} is not text: return a str or a dict with a "
                             "'text' string, or build it with render_mode='ansi'")
        image = None
        if env.render_mode == "rgb_array":
            frame = env.render()
            image = None if frame is None else np.asarray(frame)
        return Observation(text=text, image=image)

    def _read_goal(self, raw: Any) -> None:
        goal = getattr(self.gym_env.unwrapped, "goal", None)
        if goal is None and isinstance(raw, dict):
            goal = raw.get("mission") or raw.get("goal")
        self._goal = str(goal) if goal else self._fallback_goal

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        raw, info = self.gym_env.reset(seed=seed)
        self._read_goal(raw)
        return self._observation(raw), dict(info)

    def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        raw_action: Any = self._codes[action] if self.text_action_space is None else action
        raw, reward, terminated, truncated, info = self.gym_env.step(raw_action)
        info = dict(info)
        info.setdefault("success", bool(info.get("is_success", False)))
        return self._observation(raw), float(reward), bool(terminated), bool(truncated), info

    def close(self) -> None:
        self.gym_env.close()
