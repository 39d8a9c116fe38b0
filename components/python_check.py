"""One line instead of a traceback when a stage script is run by a Python without longturn.

Why: `dvc repro` runs `python components/<stage>.py` with whatever `python` comes first on PATH;
from a shell whose `python` is not the project's venv, every stage died on its first import with
"No module named 'components'", which says nothing of the cause. Imported only by a script run as
a file (its folder is then first on sys.path); `python -m components.<stage>` skips it.
"""

from __future__ import annotations

import importlib.util
import sys

_NEEDED = ("components", "longturn", "torch")

missing = [name for name in _NEEDED if importlib.util.find_spec(name) is None]
if missing:
    # SystemExit prints the message alone; its cause names the module for whoever catches it
    # (the GPU campaign's import probe, bench/campaign/imports.py)
    raise SystemExit(
        f"{sys.executable} has no {missing[0]!r} module: this Python is not the project's. Run "
        "`make repro` (it installs .venv and runs dvc with it), or put .venv/bin first on PATH "
        "(`source .venv/bin/activate`) before `dvc repro`"
    ) from ModuleNotFoundError(f"No module named {missing[0]!r}", name=missing[0])
