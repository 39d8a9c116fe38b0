"""Env lookup by name: built-in families, any `module:factory` plugin returning a TextEnv, or a
plain `gymnasium.Env` (class or factory result), adapted to text by `gym_adapter`."""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from longturn.envs.actions import ActionTranslator
from longturn.envs.base import TextEnv
from longturn.envs.free_text import FreeTextTranslator
from longturn.errors import SettingError
from longturn.import_path import import_object

BUILTIN: dict[str, str] = {
    "babyai": "longturn.envs.babyai:BabyAITextEnv",
    "crafter": "longturn.envs.crafter:CrafterTextEnv",
    "babaisai": "longturn.envs.babaisai:BabaIsAITextEnv",
}


def resolve_factory(name: str) -> Callable[..., Any]:
    """`babyai` or `package.module:callable` → the callable that builds one env for a task."""
    target = BUILTIN.get(name, name)
    if ":" not in target:
        raise SettingError(
            f"unknown env {name!r}: use one of {sorted(BUILTIN)} or a plugin 'module:factory'"
        )
    module_name, attr = target.split(":", 1)
    return import_object(module_name, attr, f"env {name!r}")


def declared_tasks(name: str) -> tuple[str, ...] | None:
    """The task names env `name` declares: a `TASKS` sequence of strings on its factory or in the
    factory's module, as the built-in families have. None: a plugin that declares none checks its
    task when it is built. Imports the module only, so a stage can refuse an unknown task before
    it loads a model or starts a worker."""
    factory = resolve_factory(name)
    for owner in (factory, inspect.getmodule(factory)):
        found = getattr(owner, "TASKS", None)
        if isinstance(found, (list, tuple)) and all(isinstance(t, str) for t in found):
            return tuple(found)
    return None


def _is_gym_class(obj: Any) -> bool:
    gym = sys.modules.get("gymnasium")  # a gymnasium env's module has imported it already
    return gym is not None and isinstance(obj, type) and issubclass(obj, gym.Env)


def _takes_task(cls: type) -> bool:
    try:
        return "task" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def make_env(name: str, task: str, **kwargs: Any) -> TextEnv:
    """Build one text env; constructor errors (bad task, bad kwarg) surface with the env named.

    A gymnasium.Env class gets `env.kwargs` (and `task=` only if its constructor names it); any
    other factory gets `task=` and `env.kwargs`. A gymnasium env that comes out is wrapped."""
    factory = resolve_factory(name)
    gym_class = _is_gym_class(factory)
    try:
        env = factory(**kwargs, **({"task": task} if not gym_class or _takes_task(factory) else {}))
    except TypeError as err:
        raise SettingError(f"env {name!r} task {task!r}: bad env.kwargs {kwargs}: {err}") from err
    if gym_class or "gymnasium" in sys.modules:
        from longturn.envs.gym_adapter import GymTextEnv, is_gym_env

        if is_gym_env(env):
            return GymTextEnv(env, name, task)  # type: ignore[return-value]
    return env


@dataclass(frozen=True)
class EnvSpec:
    """Everything needed to build one env again: in a worker process, or after a failure."""

    name: str
    task: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> TextEnv:
        return make_env(self.name, self.task, **self.kwargs)


def translator_for(env: TextEnv) -> ActionTranslator | FreeTextTranslator:
    """The action translator built from the env's own action list, synonyms and default; free
    text when the env takes its actions as text (a gymnasium Text space)."""
    space = getattr(env, "text_action_space", None)
    if space is not None or not env.actions:
        return FreeTextTranslator(env.default_action, space)
    return ActionTranslator(env.actions, env.synonyms, env.default_action)
