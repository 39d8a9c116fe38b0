"""params.yaml written from a profile: the default's comments kept, the profile's keys merged in,
and every key the stages read written out.

Why: DVC tracks params.yaml key by key (`dvc params diff`, `dvc exp run -S`), so the file the
stages read must be whole, while the profiles in configs/profiles/ stay short overlays. The first
line names the profile, so a later switch can tell a written file from one edited by hand and
refuse to drop those edits silently (docs/profiles.md).
"""

from __future__ import annotations

import copy
import io
import re
from pathlib import Path
from typing import Any

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from longturn.params.config import ParamsError, parse_params
from longturn.params.profiles import DEFAULT, EXTENDS, WHOLE, chain, resolve_profile

HEADER = re.compile(r"^# profile: (?P<name>\S+) ")


def _yaml() -> YAML:
    rt = YAML()
    rt.width = 100
    rt.indent(mapping=2, sequence=4, offset=2)
    rt.representer.add_representer(
        type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null"))
    return rt


def _merge_commented(base: CommentedMap, overlay: CommentedMap) -> None:
    """`overlay` into `base` in place, carrying the overlay's comment on each key it sets."""
    for key, value in overlay.items():
        if key == EXTENDS:
            continue
        if isinstance(value, dict) and isinstance(base.get(key), dict) and key not in WHOLE:
            _merge_commented(base[key], value)
        else:
            base[key] = value
        _carry_comment(base, overlay, key)


def _carry_comment(base: CommentedMap, overlay: CommentedMap, key: str) -> None:
    """The overlay's end-of-line comment on `key`, with the base's blank lines after it (a
    section's last key keeps the blank line that ends the section, and gains none)."""
    theirs = overlay.ca.items.get(key)
    if not theirs or theirs[2] is None:
        return
    ours = base.ca.items.get(key)
    blank = ""
    if ours and ours[2] is not None:
        blank = "\n" * (len(ours[2].value) - len(ours[2].value.rstrip("\n")) - 1)
    token = copy.copy(theirs[2])
    token.value = theirs[2].value.rstrip("\n") + "\n" + blank
    base.ca.items[key] = [None, None, token, None]


def _fill_missing(tree: CommentedMap, full: dict[str, Any]) -> None:
    """Add the keys a profile left to config.py's defaults, so DVC sees every key."""
    for key, value in full.items():
        if key not in tree:
            tree[key] = value
        elif isinstance(value, dict) and isinstance(tree[key], dict) and key not in WHOLE:
            if isinstance(tree[key], CommentedMap) and not tree[key] and value:
                tree[key].fa.set_block_style()  # `chat: {}` grows into a block
            _fill_missing(tree[key], value)


def render(profile: str | Path) -> str:
    """The whole params.yaml text for a profile file, validated."""
    path = Path(profile)
    rt = _yaml()
    files = chain(path)
    tree = rt.load(files[0].read_text())
    for overlay in files[1:]:
        _merge_commented(tree, rt.load(overlay.read_text()))
    plain = resolve_profile(path)
    params = parse_params(plain, str(path))
    _fill_missing(tree, params.model_dump(mode="json"))
    tree.ca.comment = None  # the default's own header describes default.yaml, not this file
    out = io.StringIO()
    rt.dump(tree, out)
    text = header(path) + out.getvalue()
    if parse_params(yaml.safe_load(text), str(path)) != params:  # the merge kept every value
        raise AssertionError(f"{path}: the written params differ from the merged profile")
    return text


def header(path: Path) -> str:
    name = path.stem
    try:
        shown = path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        shown = path.as_posix()
    over = "" if path.name == DEFAULT else f" over {DEFAULT}"
    return (f"# profile: {name} (written by `make params PROFILE={name}`, i.e. `longturn params {name}`)\n"
            f"# from {shown}{over}; lasting changes belong in the profile\n")


def written_profile(text: str) -> str | None:
    """The profile a params.yaml names in its first line (None: not written by `longturn params`)."""
    match = HEADER.match(text)
    return match.group("name") if match else None


def hand_edits(params_path: Path, profiles_dir: Path) -> str | None:
    """Why overwriting `params_path` would lose work (None: it is exactly a written profile)."""
    if not params_path.exists():
        return None
    text = params_path.read_text()
    name = written_profile(text)
    if name is None:
        return f"{params_path} was not written by `longturn params` (no '# profile:' first line)"
    source = profiles_dir / f"{name}.yaml"
    if not source.is_file():
        return f"{params_path} names profile {name!r}, which is not in {profiles_dir}"
    try:
        if render(source) == text:
            return None
    except ParamsError:
        pass
    return f"{params_path} differs from profile {name!r} as written ({source}): it has hand edits"


def profile_path(name: str, profiles_dir: Path) -> Path:
    """`name` as a profile file: a path as given, else `<profiles_dir>/<name>.yaml`."""
    path = Path(name) if name.endswith((".yaml", ".yml")) or "/" in name else profiles_dir / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in profiles_dir.glob("*.yaml"))) or "none"
        raise ParamsError(f"profile {name!r}: no file {path} (profiles in {profiles_dir}: {known})")
    return path
