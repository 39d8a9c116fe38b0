"""Env lookup by name: built-in families, or any `module:factory` plugin returning a TextEnv."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from longturn.envs.actions import ActionTranslator
from longturn.envs.base import TextEnv

BUILTIN: dict[str, str] = {
    "babyai": "longturn.envs.babyai:BabyAITextEnv",
    "crafter": "longturn.envs.crafter:CrafterTextEnv",
    "babaisai": "longturn.envs.babaisai:BabaIsAITextEnv",
}


def resolve_factory(name: str) -> Callable[..., TextEnv]:
    """`babyai` or `package.module:callable` → the callable that builds one env for a task."""
    target = BUILTIN.get(name, name)
    if ":" not in target:
        raise ValueError(
            f"unknown env {name!r}: use one of {sorted(BUILTIN)} or a plugin 'module:factory'"
        )
    module_name, attr = target.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"env {name!r}: cannot import module {module_name!r}: {err}") from err
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"env {name!r}: module {module_name!r} has no {attr!r}") from None


def make_env(name: str, task: str, **kwargs: Any) -> TextEnv:
    """Build one text env; constructor errors (bad task, bad kwarg) surface with the env named."""
    factory = resolve_factory(name)
    try:
        return factory(task=task, **kwargs)
    except TypeError as err:
        raise ValueError(f"env {name!r} task {task!r}: bad env.kwargs {kwargs}: {err}") from err


def translator_for(env: TextEnv) -> ActionTranslator:
    """The action translator built from the env's own action list, synonyms and default."""
    return ActionTranslator(env.actions, env.synonyms, env.default_action)
