"""Tasks of the chat protocol by name: `env.tasks` lists built-in names or `package.module:OBJECT`
import paths of plugin tasks.

A task is any object with (episodes, metrics and reports call it by its `env.tasks` entry)
- `record(seed) -> dict`: the task record the rollout plays (`messages`, and what tools and the
  interaction need: `tools_kwargs`, `interaction_kwargs`), the same for the same seed;
- `reward(record, messages) -> float`: the rule-based reward of a finished conversation, used
  when no interaction scores the replies;
- `success(record, messages) -> bool`: what evaluation counts as solved, where the interaction
  does not say (`BaseInteraction.succeeded`).
"""

from __future__ import annotations

from typing import Any

from longturn.errors import SettingError
from longturn.import_path import import_object

BUILTIN = {"arithmetic": "longturn.tasks.arithmetic:TASK",
           "arithmetic_plain": "longturn.tasks.arithmetic:PLAIN",
           "arithmetic_gsm8k": "longturn.tasks.arithmetic_gsm8k:TASK",
           "babyai_goto_frames": "longturn.tasks.env_frames:BABYAI_GOTO_FRAMES",
           "babyai_goto_text": "longturn.tasks.env_frames:BABYAI_GOTO_TEXT"}
_METHODS = ("record", "reward", "success")


def load_task(name: str, key: str = "env.tasks") -> Any:
    """The task called `name` (built-in) or at `package.module:OBJECT`; errors name `key`, the
    setting that lists it (env.tasks or eval.tasks)."""
    path = BUILTIN.get(name, name)
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise SettingError(f"{key}: {name!r} is neither a built-in sequence task "
                           f"({', '.join(sorted(BUILTIN))}) nor an import path "
                           "'package.module:OBJECT'")
    task = import_object(module_name, attr, f"{key} {name!r}")
    missing = [m for m in _METHODS if not callable(getattr(task, m, None))]
    if missing:
        raise SettingError(f"{key} {name!r}: the task object lacks {', '.join(missing)} "
                           "(longturn/tasks/registry.py says what a task provides)")
    return task
