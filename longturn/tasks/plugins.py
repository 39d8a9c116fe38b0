"""YAML plugin lists (tools, interactions): each entry names a class by import path.

Shared by `tools` and `interactions` so that both report a missing file, bad YAML, a missing key
or an import that fails in the same words, naming the file and the entry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from longturn.errors import SettingError
from longturn.import_path import import_object


def read_entries(path: str | Path, key: str) -> list[dict[str, Any]]:
    """The list under `key` in a YAML file, each entry a mapping."""
    path = Path(path)
    if not path.is_file():
        raise SettingError(f"{key} file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise SettingError(f"{key} file {str(path)!r} is not valid YAML: {err}") from err
    entries = data.get(key) if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SettingError(f"{key} file {str(path)!r} needs a top-level {key!r} list of mappings")
    return entries


def import_class(target: Any, where: str) -> Any:
    """`package.module:Name` (or `package.module.Name`) → the class or function."""
    if not isinstance(target, str) or not target.strip():
        raise SettingError(f"{where}: expected an import path like 'package.module:Name', "
                           f"got {target!r}")
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    return import_object(module_name, attr, where)
