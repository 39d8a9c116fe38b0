"""The names params gives resolve, as the stages will resolve them (preflight, by protocol): an
env and its tasks, or a conversation's tasks, tools, interaction and rollout function. Nothing
here builds an env or starts an episode; plugins are imported and looked up only."""

from __future__ import annotations

from longturn.envs.registry import declared_tasks
from longturn.errors import SettingError
from longturn.params.config import Params
from longturn.rollout.conversation_setup import ConversationRun
from longturn.tasks.registry import load_task


def check_env_tasks(params: Params) -> None:
    """Protocol action: `env.name` resolves (a plugin is imported) and every task of env.tasks and
    eval.tasks is one the env declares."""
    try:
        known = declared_tasks(params.env.name)
    except SettingError as err:
        raise SettingError(f"env.name: {err}") from None
    if known is None:  # a plugin without a TASKS list: its constructor checks the task
        return
    for key, names in (("env.tasks", params.env.tasks), ("eval.tasks", params.eval.tasks)):
        unknown = [name for name in names if name not in known]
        if unknown:
            raise SettingError(f"{key}: env {params.env.name!r} has no task "
                               f"{', '.join(map(repr, unknown))}; its tasks: {', '.join(known)}")


def check_conversation_plugins(params: Params) -> None:
    """Protocol chat: the tasks, tools, interaction and rollout function resolve, as the stages
    resolve them (tools and interactions are built from their YAML; no episode starts)."""
    ConversationRun.from_params(params, progress=False)
    for name in params.eval.tasks:
        if name not in params.env.tasks:
            load_task(name, "eval.tasks")
