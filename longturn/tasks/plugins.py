"""YAML plugin lists (tools, interactions): each entry names a class by import path.

Shared by `tools` and `interactions` so that both report a missing file, bad YAML, a missing key
or an import that fails in the same words, naming the file and the entry. Both read this
project's spelling and verl's (`class` or `class_name`, a top-level `interactions` or
`interaction` list), so a verl config file loads as it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from longturn.errors import SettingError
from longturn.import_path import import_object


def read_entries(path: str | Path, key: str, verl_key: str | None = None
                 ) -> list[dict[str, Any]]:
    """The list under `key` (or under verl's `verl_key`) in a YAML file, each entry a mapping."""
    path = Path(path)
    if not path.is_file():
        raise SettingError(f"{key} file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise SettingError(f"{key} file {str(path)!r} is not valid YAML: {err}") from err
    found = [k for k in (key, verl_key) if k and isinstance(data, dict) and k in data]
    if len(found) > 1:
        raise SettingError(f"{key} file {str(path)!r} has both {key!r} and verl's "
                           f"{verl_key!r}: keep one list")
    entries = data.get(found[0]) if found else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        also = f" (or verl's {verl_key!r})" if verl_key else ""
        raise SettingError(f"{key} file {str(path)!r} needs a top-level {key!r}{also} list of "
                           "mappings")
    return entries


def entry_keys(entry: dict[str, Any], where: str, allowed: dict[str, str]) -> dict[str, Any]:
    """The entry with verl's key names turned into this project's (`allowed`: verl's name → this
    project's; a name mapped to itself is the same in both); a key known to neither, or one
    given in both spellings, is refused naming it."""
    ours = set(allowed.values())
    unknown = sorted(set(entry) - set(allowed) - ours)
    if unknown:
        raise SettingError(f"{where}: unknown key {unknown[0]!r}; an entry takes "
                           f"{', '.join(sorted(ours | set(allowed)))}")
    out = dict(entry)
    for verl_name, name in allowed.items():
        if verl_name == name or verl_name not in entry:
            continue
        if name in entry:
            raise SettingError(f"{where}: both {name!r} and verl's {verl_name!r}: give one")
        out[name] = out.pop(verl_name)
    return out


def import_class(target: Any, where: str) -> Any:
    """`package.module:Name` (or `package.module.Name`) → the class or function."""
    if not isinstance(target, str) or not target.strip():
        raise SettingError(f"{where}: expected an import path like 'package.module:Name', "
                           f"got {target!r}")
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    return import_object(module_name, attr, where)


class EpisodeInstances:
    """A plug-in (this project's tools and interactions) whose per-episode state lives in
    `self.instances[instance_id]`; so a checkpoint can keep a running episode's state."""

    instances: dict[str, Any]

    def episode_state(self, instance_id: str) -> Any:
        """What a checkpoint keeps of a running episode, picklable: its `instances` entry (a
        plug-in that keeps per-episode state elsewhere overrides this and `restore_episode`)."""
        return self.instances.get(instance_id)

    def restore_episode(self, instance_id: str, state: Any) -> None:
        """A running episode again, from what `episode_state` gave (a resumed run)."""
        if state is not None:
            self.instances[instance_id] = state
