"""Interactions: the user side of a conversation, giving turn-level feedback after each reply
that calls no tool, and able to end the episode. Declared in YAML like tools:

    interactions:
      - name: revise                                      # tasks pick one by name
        class: longturn.tasks.arithmetic:RevisionInteraction
        config: {max_revisions: 1}

verl's layout loads too (a top-level `interaction:` list, entries with `class_name`), and a
class may be this project's synchronous `BaseInteraction` below or a verl-style async one
(`longturn.tasks.verl_api.BaseInteraction`). The protocol is verl's: `start` per episode,
`generate_response` per reply → (should_terminate, text for the user message, score, metrics),
`finalize` at the end; `BaseInteraction`'s other methods, and `close` (`close_all`), are optional
hooks of this project's own (docs/design.md §5c). The rollout runs either kind through
`start_all` / `respond` / `finalize_all`, every episode of a lock-step at once, each with its own
interaction (`interaction_of`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from longturn.agent.prompts import ActionView
from longturn.envs.actions import ParsedAction
from longturn.envs.failures import EnvFailure
from longturn.errors import SettingError
from longturn.tasks import verl_api
from longturn.tasks.plugin_loop import CallTimedOut, invoke, run_together, within
from longturn.tasks.plugins import EpisodeInstances, entry_keys, import_class, read_entries


class BaseInteraction(EpisodeInstances):
    """A conversation partner; per-episode state lives in `self.instances[instance_id]`."""

    def __init__(self, config: dict[str, Any], name: str):
        self.config = dict(config)
        self.name = name
        self.instances: dict[str, dict[str, Any]] = {}

    def start(self, instance_id: str, **kwargs: Any) -> None:
        """Begin an episode (kwargs: the task's `interaction_kwargs`, e.g. the ground truth).
        An `EnvFailure` raised here (an env behind it that failed to reset) means the episode
        does not begin: the rollout tries it again, or its slot's next one."""
        self.instances[instance_id] = dict(kwargs)

    def opening(self, instance_id: str) -> tuple[list[dict[str, Any]], list[Any]] | None:
        """The messages that open the episode, asked right after `start`, and their frames (one
        per `<image>` line, in order): appended to the task record's messages before the first
        reply. None: the task's messages are the whole opening."""
        return None

    def generate_response(self, instance_id: str, messages: list[dict[str, Any]]
                          ) -> tuple[bool, str, float, dict[str, Any]]:
        """React to the conversation so far (its last message is the model's reply)."""
        raise NotImplementedError

    def truncated(self, instance_id: str) -> bool:
        """Whether the episode this interaction just ended was cut by a time limit rather than
        finished (asked only after `generate_response` returned should_terminate)."""
        return False

    def succeeded(self, instance_id: str) -> bool | None:
        """Whether the episode succeeded, asked when it ends (before `finalize`); None: this
        interaction does not know, the task's `success` decides."""
        return None

    def read_action(self, instance_id: str) -> ParsedAction | None:
        """What the episode's last reply was read as, asked after each `generate_response`: the
        env action it named (or the default action it fell back to), for the reply's action
        columns and validity. None: replies are not actions."""
        return None

    def action_view(self, instance_id: str) -> ActionView | None:
        """The episode as an action prompt shows it (the env's instructions, its steps, the
        current observation), asked for each reply's prompt when the rollout renders the action
        protocol's prompts. None: this interaction plays no env."""
        return None

    def action_names(self) -> list[str]:
        """Every action of the envs this interaction plays, in their own order (the action
        mix's names). []: it plays no env."""
        return []

    def finalize(self, instance_id: str) -> None:
        self.instances.pop(instance_id, None)


# an interactions entry's keys: verl's name → this project's
_INTERACTION_KEYS = {"class_name": "class", "name": "name", "config": "config"}


def load_interactions(path: str | Path) -> dict[str, Any]:
    """Every interaction in an interactions YAML file, by name: this project's layout
    (`interactions:` entries with `class`) or verl's (`interaction:` entries with `class_name`),
    each class this project's `BaseInteraction` or a verl-style async one
    (`longturn.tasks.verl_api.BaseInteraction`)."""
    out: dict[str, Any] = {}
    for i, raw in enumerate(read_entries(path, "interactions", verl_key="interaction")):
        where = f"{path} interactions[{i}]"
        entry = entry_keys(raw, where, _INTERACTION_KEYS)
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise SettingError(f"{where}: 'config' must be a mapping")
        cls = import_class(entry.get("class"), where)
        if not (isinstance(cls, type) and issubclass(cls, (BaseInteraction,
                                                          verl_api.BaseInteraction))):
            raise SettingError(f"{where}: {entry['class']!r} is not an interaction class: "
                               "subclass longturn.tasks.interactions.BaseInteraction, or a verl "
                               "interaction with its import changed to `from "
                               "longturn.tasks.verl_api import BaseInteraction`")
        name = entry.get("name")
        if not name and "class_name" in raw:  # verl's: the class less `Interaction`, lowercased
            simple = entry["class"].replace(":", ".").rpartition(".")[2]
            name = (simple.removesuffix("Interaction") or simple).lower()
        elif not name:
            name = cls.__name__
        if name in out:
            raise SettingError(f"{where}: the name {name!r} is used twice")
        if issubclass(cls, verl_api.BaseInteraction):
            out[name] = cls(config={**config, "name": name})  # verl puts the name in the config
        else:
            out[name] = cls(config, name)
    return out


# ---- the rollout's calls, for either kind, run on the plug-in loop ---------------------------

def _is_verl(interaction: Any) -> bool:
    return isinstance(interaction, verl_api.BaseInteraction)


async def _timed(interaction: Any, method: str, timeout_s: float | None, *args: Any,
                 **kwargs: Any) -> Any:
    """One method call under the time limit; a hang or an exception ends the run naming the
    interaction and the method (an interaction is part of the task, not model output)."""
    try:
        return await within(invoke(getattr(interaction, method), *args, **kwargs), timeout_s)
    except CallTimedOut:
        raise RuntimeError(f"interaction {interaction.name!r}: {method} did not return within "
                           f"{timeout_s:g} s (rollout.chat.tool_timeout_s)") from None


def interaction_of(chosen: Any, task: dict[str, Any], episode_id: str) -> Any:
    """The interaction one episode talks to. `chosen` is the run's: one interaction for every
    episode (rollout.chat.interaction), or a file's interactions by name, of which the task's
    `interaction_kwargs["name"]` picks one as in verl's agent loop. verl requires the name;
    here a task without one gets a file's only entry, so tasks that never name one keep working."""
    if not isinstance(chosen, dict):
        return chosen
    name = (task.get("interaction_kwargs") or {}).get("name")
    where = f"episode {episode_id} (task {task.get('task', '?')!r})"
    if name is None and len(chosen) == 1:
        return next(iter(chosen.values()))
    if name is None:
        raise SettingError(f"{where}: interaction_kwargs has no 'name' and "
                           f"rollout.chat.interactions declares {sorted(chosen)}: name one in "
                           "the task's interaction_kwargs, or set rollout.chat.interaction")
    if not isinstance(name, str) or name not in chosen:
        raise SettingError(f"{where}: interaction_kwargs name {name!r} is not in "
                           f"rollout.chat.interactions (it declares {sorted(chosen)})")
    return chosen[name]


def start_all(episodes: list[tuple[Any, str, dict[str, Any]]], timeout_s: float | None
              ) -> list[str | None]:
    """Begin each (its interaction, episode id, the task's interaction_kwargs), all at once.
    Per episode None, or why it could not begin: the reason of the `EnvFailure` its `start`
    raised (an env behind it that failed to reset; the interaction has restarted it)."""
    async def start(interaction: Any, episode: str, kwargs: dict[str, Any]) -> str | None:
        try:
            await _timed(interaction, "start_interaction" if _is_verl(interaction) else "start",
                         timeout_s, episode, **kwargs)
        except EnvFailure as failure:
            return failure.reason
        return None

    return run_together([lambda i=interaction, e=episode, k=kwargs: start(i, e, k)
                         for interaction, episode, kwargs in episodes])


async def respond(interaction: Any, instance_id: str, messages: list[dict[str, Any]],
                  interaction_kwargs: dict[str, Any], timeout_s: float | None
                  ) -> tuple[bool, Any, float, dict[str, Any]]:
    """`generate_response` → (should_terminate, text for the user message, score, metrics). A
    verl-style interaction is also given the task's interaction_kwargs, as verl's agent loop
    does."""
    kwargs = interaction_kwargs if _is_verl(interaction) else {}
    return await _timed(interaction, "generate_response", timeout_s, instance_id, messages,
                        **kwargs)


def truncated(interaction: Any, instance_id: str) -> bool:
    """Whether the episode the interaction just ended was cut by a time limit (verl's
    interactions do not say: never)."""
    return False if _is_verl(interaction) else bool(interaction.truncated(instance_id))


def _optional(interaction: Any, hook: str, instance_id: str) -> Any:
    """This project's optional hook `hook` of the interaction, asked about the episode (None
    where it has none: verl's never do)."""
    ask = None if _is_verl(interaction) else getattr(interaction, hook, None)
    return ask(instance_id) if ask is not None else None


def opening(interaction: Any, instance_id: str) -> tuple[list[dict[str, Any]], list[Any]] | None:
    """The messages (and frames) the interaction opens the episode with (None: none)."""
    return _optional(interaction, "opening", instance_id)


def succeeded(interaction: Any, instance_id: str) -> bool | None:
    """Whether the interaction says the episode succeeded (None: it does not say)."""
    said = _optional(interaction, "succeeded", instance_id)
    return None if said is None else bool(said)


def read_action(interaction: Any, instance_id: str) -> ParsedAction | None:
    """The action the interaction read the episode's last reply as (None: it does not read
    actions)."""
    return _optional(interaction, "read_action", instance_id)


def action_view(interaction: Any, instance_id: str) -> ActionView | None:
    """The episode as the interaction's env shows it to an action prompt (None: it plays no
    env)."""
    return _optional(interaction, "action_view", instance_id)


def action_names(interactions: Any) -> list[str]:
    """Every action the envs behind an interaction (or a file's, by name) know, in their order;
    [] where none plays an env (verl's never do)."""
    chosen = interactions.values() if isinstance(interactions, dict) else [interactions]
    return list(dict.fromkeys(name for i in chosen if i is not None and not _is_verl(i)
                              for name in getattr(i, "action_names", list)()))


def close_all(interactions: Any) -> None:
    """Let an interaction (or a file's, by name) close what it holds for its episodes (an env
    interaction's envs and their worker processes); one that holds nothing has no `close`."""
    chosen = interactions.values() if isinstance(interactions, dict) else [interactions]
    for interaction in chosen:
        if interaction is not None and not _is_verl(interaction):
            getattr(interaction, "close", lambda: None)()


def finalize_all(episodes: list[tuple[Any, str]], timeout_s: float | None) -> None:
    """End each (its interaction, episode id), all at once."""
    run_together([lambda i=interaction, e=episode: _timed(
        i, "finalize_interaction" if _is_verl(i) else "finalize", timeout_s, e)
        for interaction, episode in episodes])
