"""Run profiles as overlays: a YAML file that sets only the keys where it differs from the
profile it `extends` (default.yaml in its own folder when it names none and one is there; the
merge rules: docs/profiles.md).

Why: the profiles a GPU campaign proves (configs/profiles/) differ from a full params file in a
handful of keys; as overlays a reader sees exactly what each one changes, and a change to the
base reaches every profile built on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from longturn.params.config import Params, ParamsError, parse_params

EXTENDS = "extends"
DEFAULT = "default.yaml"  # the root every profile in a folder extends unless it names another
WHOLE = {"kwargs"}  # mappings an overlay replaces instead of merging into


def merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """`overlay` on top of `base`, recursively for mappings; neither is modified."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in WHOLE:
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value for every leaf (`env.kwargs`, a whole value, counts as one leaf)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and key not in WHOLE:
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ParamsError(f"profile file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ParamsError(f"{path}: a profile must be a mapping of params keys")
    return data


def _parent(path: Path, data: dict[str, Any]) -> Path | None:
    """What `path` extends: its `extends`, else default.yaml beside it (a file with neither, such
    as a whole params.yaml, stands alone)."""
    parent = data.get(EXTENDS)
    if parent is None:
        implicit = path.parent / DEFAULT
        return implicit.resolve() if path.name != DEFAULT and implicit.is_file() else None
    if not isinstance(parent, str):
        raise ParamsError(f"{path}: `{EXTENDS}` must be a path, got {parent!r}")
    return (path.parent / parent).resolve()


def chain(path: str | Path) -> list[Path]:
    """The profile files from the root (a whole file) to `path`, in merge order."""
    files: list[Path] = []
    current: Path | None = Path(path).resolve()
    while current is not None:
        if current in files:
            raise ParamsError(f"{current}: `{EXTENDS}` loops back to itself")
        files.append(current)
        current = _parent(current, _read(current))
    return files[::-1]


def resolve_profile(path: str | Path) -> dict[str, Any]:
    """The full params mapping a profile file stands for (its `extends` chain merged)."""
    merged: dict[str, Any] = {}
    for file in chain(path):
        data = _read(file)
        data.pop(EXTENDS, None)
        merged = merge(merged, data)
    return merged


def load_profile(path: str | Path) -> Params:
    """The profile merged and validated; errors name the profile file and the dotted key."""
    return parse_params(resolve_profile(path), str(path))
