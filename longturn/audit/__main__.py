"""`python -m longturn.audit ...`, the same as the `longturn audit` console script."""

from __future__ import annotations

import sys

from longturn.audit.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m longturn.audit"))
