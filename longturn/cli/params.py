"""`longturn params`: write params.yaml from a profile in configs/profiles/ (`make params PROFILE=…`).

A switch is one command and shows up in `dvc params diff`. A params.yaml with hand edits (one
that is not exactly what its named profile writes) is not overwritten without --force, so an
experiment's changes are never dropped by a profile switch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from longturn.atomic import write_text
from longturn.params.config import load_params
from longturn.errors import UserError
from longturn.params.file import hand_edits, profile_path, render, written_profile
from longturn.params.profiles import leaves, resolve_profile

PROFILES_DIR = "configs/profiles"
EXAMPLES = """examples:
  longturn params --list
  longturn params gpu1                 # params.yaml from configs/profiles/gpu1.yaml
  longturn params default              # back to the CPU default
  longturn params --check              # is params.yaml what its profile writes? its names known?
  longturn params tools --out /tmp/tools-params.yaml"""


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile", nargs="?", default="default",
                   help="a profile name in --dir, or a profile file (default: default)")
    p.add_argument("--out", default="params.yaml", help="file to write (default: params.yaml)")
    p.add_argument("--dir", default=PROFILES_DIR, help=f"profiles folder (default: {PROFILES_DIR})")
    p.add_argument("--force", action="store_true", help="overwrite --out even with hand edits")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 unless --out is exactly what its profile writes, "
                        "2 if a name in it (env, task, engine, plugin) is unknown")
    p.add_argument("--list", action="store_true", help="the profiles, with their first line")
    return p


def _list(profiles_dir: Path) -> int:
    paths = sorted(profiles_dir.glob("*.yaml"))
    width = max((len(path.stem) for path in paths), default=0)  # names in one column
    for path in paths:
        first = next((line for line in path.read_text().splitlines() if line.startswith("#")), "")
        print(f"{path.stem:{width}} {first.lstrip('# ')}")
    return 0


def _changed_keys(profile: Path, default: Path) -> int:
    ours, base = leaves(resolve_profile(profile)), leaves(resolve_profile(default))
    return sum(1 for key, value in ours.items() if base.get(key, object()) != value)


def _check(out: Path, profiles_dir: Path) -> int:
    """1 when `out` is not exactly a written profile; else the names every stage checks before
    work (env, tasks, engine, the chat protocol's plugins), so a bad name fails here, not minutes
    into a DVC run (a UserError: exit 2)."""
    from longturn.run.preflight import preflight  # imports torch: 1.5 s a write need not pay

    if not out.is_file():
        raise UserError(f"{out}: no such file; write one with `longturn params NAME`")
    reason = hand_edits(out, profiles_dir)
    if reason:
        print(reason)
        return 1
    preflight(load_params(out), None)
    print(f"{out}: exactly profile {written_profile(out.read_text())!r}; its names check out")
    return 0


def run(args: argparse.Namespace) -> int:
    profiles_dir, out = Path(args.dir), Path(args.out)
    if args.list:
        return _list(profiles_dir)
    if args.check:
        return _check(out, profiles_dir)
    source = profile_path(args.profile, profiles_dir)
    text = render(source)
    reason = hand_edits(out, profiles_dir)
    if reason and not args.force:
        raise UserError(f"{reason}; not overwritten. Move the edits into a profile, or rerun "
                        "with --force (make params PROFILE=... FORCE=1) to drop them")
    write_text(out, text)
    changed = _changed_keys(source, profiles_dir / "default.yaml")
    print(f"{out}: profile {source.stem} ({changed} keys differ from default); "
          "`dvc params diff` shows the switch")
    return 0


def main(argv: Sequence[str] | None = None, prog: str = "longturn params") -> int:
    args = _parser(prog).parse_args(argv)
    try:
        return run(args)
    except UserError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
