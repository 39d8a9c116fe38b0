"""Interactions: the user side of a conversation, giving turn-level feedback after each reply
that calls no tool, and able to end the episode. Declared in YAML like tools:

    interactions:
      - name: revise                                      # tasks pick one by name
        class: longturn.tasks.arithmetic:RevisionInteraction
        config: {max_revisions: 1}

The protocol is verl's: `start` per episode, `generate_response` per reply →
(should_terminate, text for the user message, score, metrics), `finalize` at the end. One
addition, `truncated`: an interaction that ended the episode on a time limit (an env's gymnasium
`truncated`) says so, and the episode is bootstrapped like one cut by the turn limits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from longturn.errors import SettingError
from longturn.tasks.plugins import import_class, read_entries


class BaseInteraction:
    """A conversation partner; per-episode state lives in `self.instances[instance_id]`."""

    def __init__(self, config: dict[str, Any], name: str):
        self.config = dict(config)
        self.name = name
        self.instances: dict[str, dict[str, Any]] = {}

    def start(self, instance_id: str, **kwargs: Any) -> None:
        """Begin an episode (kwargs: the task's `interaction_kwargs`, e.g. the ground truth)."""
        self.instances[instance_id] = dict(kwargs)

    def generate_response(self, instance_id: str, messages: list[dict[str, Any]]
                          ) -> tuple[bool, str, float, dict[str, Any]]:
        """React to the conversation so far (its last message is the model's reply)."""
        raise NotImplementedError

    def truncated(self, instance_id: str) -> bool:
        """Whether the episode this interaction just ended was cut by a time limit rather than
        finished (asked only after `generate_response` returned should_terminate)."""
        del instance_id
        return False

    def finalize(self, instance_id: str) -> None:
        self.instances.pop(instance_id, None)


def load_interactions(path: str | Path) -> dict[str, BaseInteraction]:
    """Every interaction in an interactions YAML file, by name."""
    out: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(read_entries(path, "interactions")):
        where = f"{path} interactions[{i}]"
        cls = import_class(entry.get("class"), where)
        if not (isinstance(cls, type) and issubclass(cls, BaseInteraction)):
            raise SettingError(f"{where}: {entry['class']!r} is not a longturn BaseInteraction "
                               "subclass")
        name = entry.get("name") or cls.__name__
        if name in out:
            raise SettingError(f"{where}: the name {name!r} is used twice")
        out[name] = cls(entry.get("config") or {}, name)
    return out
