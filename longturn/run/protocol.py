"""How replies are read (`rollout.protocol`, docs/design.md §1): the one place that setting picks
the code which plays, evaluates and validates episodes and checks the names params gives (how
episodes are collected is the estimator's: run/wiring.py).

- `action`: THINK/ACTION replies parsed into an action of `env.name`, the env's episodes played
  as conversations of its interaction (`ConversationRun.of_env`).
- `chat`: chat replies on the tasks of `env.tasks`: tool calls run by `rollout.chat.tools`, free
  text answered by the interaction (rollout/conversation_rollout.py).

Both write the one sample schema (docs/design.md §4), so scoring, the metrics
(rollout/sample_metrics.py), the update, the report and the audit never ask.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from longturn.engines.base import Engine
from longturn.engines.registry import make_engine
from longturn.envs.registry import declared_tasks
from longturn.errors import SettingError
from longturn.params.config import Params
from longturn.rollout.conversation_setup import ConversationRun
from longturn.run import conversation_validation, validation
from longturn.run.evaluation import PlanFactory, conversation_plan, env_plan
from longturn.run.evaluation import evaluate as evaluate_with
from longturn.run.models import load_tokenizer
from longturn.tasks.registry import load_task


@dataclass(frozen=True)
class Validation:
    """How validate_prompts checks a protocol's prompts: what it plays (samples of the one
    schema, written as they are), why the gate (on each task's `valid_action_ratio`) fails, and
    the report."""

    play: Callable[[Engine, Any, Params, Any, list[int]], list[Any]]
    gate_failures: Callable[[list[Any], float], list[str]]
    render_report: Callable[[list[Any], list[str], float, dict[str, Any], Any], str]


@dataclass(frozen=True)
class Protocol:
    """What differs between the two ways of reading replies; everything else is shared."""

    # its episodes as conversations: (params, task names or None for env.tasks, progress) → run
    conversation_run: Callable[..., ConversationRun]
    eval_plan: PlanFactory  # how an evaluation plays, orders, summarises and logs
    check_names: Callable[[Params], None]  # the names params gives resolve (preflight)
    validation: Validation


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
    ConversationRun.from_params(params, progress=False).close()
    for name in params.eval.tasks:
        if name not in params.env.tasks:
            load_task(name, "eval.tasks")


def _validate_envs(engine: Engine, tokenizer: Any, params: Params, sampling: Any,
                   seeds: list[int]) -> list[Any]:
    return [validation.validate_env_task(engine, tokenizer, params, task, sampling, seeds)
            for task in params.eval.tasks]


PROTOCOLS = {
    "action": Protocol(
        conversation_run=ConversationRun.of_env, eval_plan=env_plan, check_names=check_env_tasks,
        validation=Validation(
            _validate_envs, validation.gate_failures,
            lambda results, failures, gate, settings, tokenizer:
                validation.render_report(results, failures, gate, settings))),
    "chat": Protocol(
        conversation_run=ConversationRun.from_params, eval_plan=conversation_plan,
        check_names=check_conversation_plugins,
        validation=Validation(
            conversation_validation.validate_conversation_tasks,
            conversation_validation.conversation_gate_failures,
            conversation_validation.render_conversation_report)),
}


def protocol(params: Params) -> Protocol:
    """The protocol `rollout.protocol` names (params validated it is one of PROTOCOLS)."""
    return PROTOCOLS[params.rollout.protocol]


def evaluate(engine: Engine, tokenizer: Any, params: Params, out_dir: str | Path,
             policy_version: str, run_id: str = "eval", progress: bool = True,
             model_dir: str | Path | None = None) -> dict[str, Any]:
    """Play the eval episodes with `engine` (on the weights in `model_dir`, which keys the
    journal of an evaluation that died) and write turns/episodes Parquet and metrics.json."""
    return evaluate_with(protocol(params).eval_plan, engine, tokenizer, params, out_dir,
                         policy_version, run_id, progress, model_dir)


def evaluate_model(model_dir: str | Path, params: Params, out_dir: str | Path,
                   policy_version: str, progress: bool = True) -> dict[str, Any]:
    """Build the configured engine on `model_dir` and evaluate it."""
    with closing(make_engine(str(model_dir), params)) as engine:
        return evaluate(engine, load_tokenizer(model_dir), params, out_dir, policy_version,
                        progress=progress, model_dir=model_dir)
