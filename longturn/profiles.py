"""Run profiles as overlays: a YAML file that names the params file it `extends` and sets only
the keys it changes.

Why: the profiles a GPU campaign proves (configs/profiles/) differ from a full params file in a
handful of keys; as overlays a reader sees exactly what each one changes, and a change to the
base reaches every profile built on it. Mappings merge key by key, anything else (lists
included) replaces the base's value, and so does `env.kwargs` as a whole (an env family's
constructor arguments mean nothing to another family). `extends` is a path relative to the
overlay's own file and may itself be an overlay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from longturn.config import Params, ParamsError, parse_params

EXTENDS = "extends"
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


def resolve_profile(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The full params mapping a profile file stands for (its `extends` chain merged)."""
    path = Path(path).resolve()
    if path in _seen:
        raise ParamsError(f"{path}: `extends` loops back to itself")
    data = _read(path)
    parent = data.pop(EXTENDS, None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ParamsError(f"{path}: `{EXTENDS}` must be a path, got {parent!r}")
    return merge(resolve_profile(path.parent / parent, _seen + (path,)), data)


def load_profile(path: str | Path) -> Params:
    """The profile merged and validated; errors name the profile file and the dotted key."""
    return parse_params(resolve_profile(path), str(path))


def write_profile(path: str | Path, out: str | Path) -> Path:
    """Write the profile as one full params file (what the stages read), validated first."""
    data = resolve_profile(path)
    parse_params(data, str(path))
    Path(out).write_text(f"# written from {Path(path).name}: edit that file, not this one\n"
                         + yaml.safe_dump(data, sort_keys=False))
    return Path(out)
