"""Which modules the stages need that this node lacks, found in seconds before the first stage.

Why: a GPU node has only the packages carried to it. A missing one used to surface as a stage's
traceback minutes into a lease (jsonschema, after prepare_model, on the first H200 campaign).
Each stage script is run with --help in one interpreter, which imports everything the stage
imports at start; every module that cannot be found is named.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# argv: JSON list of top-level modules to treat as absent (a test's stand-in for a bare node),
# then the stage scripts. Prints {module: [scripts]}: the first module each script lacks (once
# it is carried, a rerun names the next, if any).
_PROBE = """if True:
    import importlib.abc, json, os, runpy, sys
    absent, scripts = set(json.loads(sys.argv[1])), sys.argv[2:]
    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in absent:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Absent())
    missing = {}
    for script in scripts:
        sys.argv = [script, "--help"]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python script` does
        try:
            runpy.run_path(script, run_name="__main__")
        except (SystemExit, ModuleNotFoundError) as err:  # --help exits; a lack stops it first
            lack = err if isinstance(err, ModuleNotFoundError) else err.__cause__
            if isinstance(lack, ModuleNotFoundError):  # components/python_check.py's names it
                missing.setdefault((lack.name or "?").split(".")[0], []).append(script)
        finally:
            sys.path.pop(0)
    print("MISSING " + json.dumps(missing))
"""


def stage_scripts(stages: list[Any]) -> list[str]:
    """The stage scripts (components/*.py, relative to the root) the stages' commands run, once
    each, whatever launcher runs them."""
    return list(dict.fromkeys(a for s in stages for a in s.argv
                              if a.startswith("components/") and a.endswith(".py")))


def missing_modules(scripts: list[str], absent: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """{module: the stage scripts that stop on it}: the first top-level module each of `scripts`
    (paths relative to the repository root) imports at start and cannot find; `absent` are
    treated as missing (tests)."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(list(absent)), *scripts],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("MISSING ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the import probe failed (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-2000:]}")
    return json.loads(lines[-1].removeprefix("MISSING "))
