"""Params → a runnable conversation rollout (the chat protocol): tasks by name, tools,
interaction, limits, the rollout function. The only place `rollout.chat` is mapped onto library
objects, so validation, evaluation, the critic warm-up and the train loop play episodes the same
way.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from dataclasses import dataclass
from typing import Any, Callable

from longturn.agent.prompts import ActionPrompt
from longturn.params.config import Params
from longturn.engines.base import Engine, SamplingParams
from longturn.errors import SettingError
from longturn.rollout.functions import AGENT_ROLLOUT, BUILTIN, resolve_rollout_function
from longturn.tasks.plugins import import_class
from longturn.tasks.env_frames import ENV_SETTINGS, EnvInteraction, EnvTask
from longturn.tasks.interactions import close_all, load_interactions
from longturn.rollout.conversation import replies_valid
from longturn.rollout.conversation_rollout import ConversationSettings, conversation_rollout
from longturn.tasks.tools import ToolBox, load_tools
from longturn.tasks.registry import load_task

# What every rollout function's record must carry for the Parquet, scoring and metrics.
REQUIRED = ("input_ids", "loss_mask", "segment_starts", "segment_ends", "segment_rewards",
            "termination", "truncated", "messages")
SLIME_ROLLOUT = "longturn.serve.slime_rollout:slime_rollout"  # rollout.slime_generate's
# and, with a history window, what each reply was given (Conversation.record)
WINDOW_REQUIRED = ("reply_steps", "window_prompts", "window_frames", "window_image_starts")


def _messages(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A record's messages (a JSON string in the built-in rollout's records)."""
    messages = record["messages"]
    return json.loads(messages) if isinstance(messages, str) else messages


def _interaction(params: Params) -> Any:
    """The one rollout.chat.interaction names, for every episode; without it the file's
    interactions by name, each task's `interaction_kwargs.name` picking its own (as in verl)."""
    s = params.rollout.chat
    if s.interactions is None:
        return None
    found = load_interactions(s.interactions)
    env_run = [i for i in found.values() if hasattr(i, "use_env_settings")]
    for interaction in env_run:  # an env behind the chat protocol: env.* as in `of_env`
        interaction.use_env_settings(s.interactions, **{
            key: getattr(params.env, key) for key in ENV_SETTINGS})
    timeout = params.env.step_timeout_s if params.env.workers else None
    if env_run and timeout is not None and timeout >= s.tool_timeout_s:
        raise SettingError(f"env.step_timeout_s ({timeout:g}) must be under "
                           f"rollout.chat.tool_timeout_s ({s.tool_timeout_s:g}), which cuts off "
                           "the interaction's whole call: a hung env step must abort its episode "
                           "first")
    if s.interaction is None:
        return found
    if s.interaction not in found:
        raise SettingError(f"rollout.chat.interaction {s.interaction!r} is not in "
                           f"{s.interactions!r} (it declares {sorted(found)})")
    return found[s.interaction]


def _rollout_function(params: Params) -> Callable[..., list[dict[str, Any]]]:
    """rollout.chat.function, or the built-in rollout; with rollout.agent (rollout.slime_generate),
    the agent (slime) rollout bound to it (named by import path: serve/ sits above this module)."""
    r = params.rollout
    if r.slime_generate is not None:
        generate = import_class(r.slime_generate, f"rollout.slime_generate {r.slime_generate!r}")
        if not inspect.iscoroutinefunction(generate):
            raise SettingError(f"rollout.slime_generate {r.slime_generate!r} is not an async "
                               "function (slime's `async def generate(args, sample, "
                               "sampling_params)`)")
        return functools.partial(import_class(SLIME_ROLLOUT, "the slime rollout"),
                                 generate=generate, timeout_s=r.agent_timeout_s)
    if r.agent is None:
        return resolve_rollout_function(r.chat.function or BUILTIN)
    agent = import_class(r.agent, f"rollout.agent {r.agent!r}")
    if not callable(agent):
        raise SettingError(f"rollout.agent {r.agent!r} is not callable")
    return functools.partial(import_class(AGENT_ROLLOUT, "the agent rollout"), agent=agent,
                             timeout_s=r.agent_timeout_s)


@dataclass
class ConversationRun:
    """The tasks, the settings (tools, interaction, limits) and the rollout function of a run
    (None: its episodes are played only in lock-steps by `ConversationPlayer`, an env's)."""

    tasks: dict[str, Any]
    settings: ConversationSettings
    function: Callable[..., list[dict[str, Any]]] | None

    @classmethod
    def from_params(cls, params: Params, task_names: list[str] | None = None,
                    progress: bool = True) -> "ConversationRun":
        s = params.rollout.chat
        tasks = {name: load_task(name) for name in (task_names or params.env.tasks)}
        settings = ConversationSettings.from_config(
            s, history_turns=params.history_window,
            tools=ToolBox(load_tools(s.tools)) if s.tools is not None else None,
            interaction=_interaction(params), reward_fn=None, progress=progress,
            action_prompt=ActionPrompt.from_config(params.prompt))
        run = cls(tasks, settings, _rollout_function(params))
        settings.reward_fn = run.reward
        opened = [n for n, task in tasks.items() if getattr(task, "opened_by_interaction", False)]
        if opened and (settings.interaction is None or params.rollout.agent is not None
                       or params.rollout.slime_generate is not None):
            raise SettingError(f"env.tasks {opened}: an env task is opened and played by its "
                               "interaction, in the built-in rollout: set rollout.chat."
                               "interactions (configs/env_interactions.yaml), without "
                               "rollout.agent or rollout.slime_generate")
        return run

    @classmethod
    def of_env(cls, params: Params, task_names: list[str] | None = None,
               progress: bool = True) -> "ConversationRun":
        """The action protocol's episodes as conversations: each task of `env.tasks` (or of
        `task_names`: an evaluation's) an `EnvTask` of `env.name` (with `env.kwargs`), played by
        an `EnvInteraction` with env.*, each reply given the action protocol's prompt (prompt.*)
        with its last `prompt.history_turns` past steps, or every one of them (`rollout.context:
        episode`: a window of the whole episode, each reply still its own sample). Their limits
        are the env's and the prompt's (env.max_turns, prompt.max_prompt_tokens, the sampler's
        max_new_tokens), none of rollout.chat's; the messages are not re-rendered at the end (no
        reply is trained on them: each reply's prompt is its window). The player plays them in
        lock-steps, whole episodes too: no rollout function."""
        e = params.env
        interaction = EnvInteraction({}, "env")
        interaction.use_env_settings("env.*", **{key: getattr(e, key) for key in ENV_SETTINGS})
        unbounded = sys.maxsize
        window = params.history_window
        settings = ConversationSettings(
            max_assistant_turns=unbounded, max_user_turns=unbounded, max_tokens=unbounded,
            max_tool_response_chars=unbounded, tool_timeout_s=None, tokenization_check="off",
            history_turns=unbounded if window is None else window,
            action_prompt=ActionPrompt.from_config(params.prompt), plain_replies=True,
            tools=None, interaction=interaction, reward_fn=None, progress=progress,
            retry_failed_starts=True)
        image = bool(e.kwargs.get("image", False))
        tasks = {task: EnvTask(e.name, task, image=image, kwargs=dict(e.kwargs))
                 for task in task_names or e.tasks}
        return cls(tasks, settings, None)

    @property
    def in_lock_steps(self) -> bool:
        """Whether `ConversationPlayer` can play its episodes reply by reply: an env's run, or
        the built-in rollout's (whose function is those lock-steps played to the end); a
        rollout function of the user's, an agent's or slime's plays whole episodes only."""
        return self.function is None or self.function is conversation_rollout

    @property
    def of_an_env(self) -> bool:
        """The action protocol's run (`of_env`): no rollout function, its episodes played in
        lock-steps by `ConversationPlayer`, each sample what its reply saw and did."""
        return self.function is None

    def close(self) -> None:
        """Let the interaction close what it holds for the run's episodes (an env
        interaction's envs and their worker processes): the run is done playing."""
        close_all(self.settings.interaction)

    def record(self, task: str, seed: int) -> dict[str, Any]:
        """The task record of one (task, seed); its `task` is the name the run knows it by."""
        return {**self.tasks[task].record(seed), "task": task, "seed": int(seed)}

    def reward(self, record: dict[str, Any], messages: list[dict[str, Any]]) -> float:
        return float(self.tasks[record["task"]].reward(record, messages))

    def success(self, record: dict[str, Any], messages: list[dict[str, Any]]) -> bool:
        return bool(self.tasks[record["task"]].success(record, messages))

    def succeeded(self, task: dict[str, Any], record: dict[str, Any]) -> bool:
        """Whether a finished episode (`record`, of task record `task`) succeeded: never when
        aborted; what its record says when the rollout knew (an env interaction's env), else
        the task's `success` of its messages."""
        if record.get("aborted"):
            return False
        if record.get("success") is not None:
            return bool(record["success"])
        return self.success(task, _messages(record))

    def play(self, engine: Engine, tokenizer: Any, sampling: SamplingParams,
             records: list[dict[str, Any]], episode_ids: list[str]) -> list[dict[str, Any]]:
        """Run the rollout function on these task records; its records, checked and named."""
        if self.of_an_env:
            raise SettingError("an env's conversations are played in lock-steps by "
                               "ConversationPlayer: this run has no rollout function")
        out = self.function(engine, tokenizer, sampling, records, self.settings)
        if not isinstance(out, list) or len(out) != len(records):
            raise SettingError(f"rollout function returned {type(out).__name__} of "
                               f"{len(out) if isinstance(out, list) else '?'} records for "
                               f"{len(records)} tasks: it must return one record per task")
        for i, (rec, task, episode_id) in enumerate(zip(out, records, episode_ids)):
            missing = [k for k in REQUIRED if k not in rec]
            if self.settings.history_turns is not None and rec.get("segment_starts"):
                missing += [k for k in WINDOW_REQUIRED if k not in rec]
            if missing:
                raise SettingError(f"rollout function: record {i} lacks {missing}")
            rec.update(episode_id=episode_id, task=task["task"], episode_seed=int(task["seed"]),
                       env_index=i)  # its slot in this call: a window's samples chain by it
            rec["success"] = self.succeeded(task, rec)
            if rec.get("reply_valid") is None:  # a rollout that did not say: its messages do
                rec["reply_valid"] = replies_valid(_messages(rec), len(rec["segment_starts"]))
        return out
