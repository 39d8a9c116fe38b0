"""The `longturn` console script: `longturn audit ...` (longturn.audit.cli) and `longturn params
...` (longturn.cli.params).

One entry point with subcommands, so later tools join it instead of adding scripts.
"""

from __future__ import annotations

import sys
from typing import Sequence

USAGE = """usage: longturn COMMAND ...

commands:
  audit    read a run's trajectory Parquet files: summary, episodes, show, gae, sql, plot, diff
           (longturn audit --help)
  params   write params.yaml from a profile in configs/profiles (longturn params --help)"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "audit":
        from longturn.audit.cli import main as audit_main

        return audit_main(args[1:], prog="longturn audit")
    if args and args[0] == "params":
        from longturn.cli.params import main as params_main

        return params_main(args[1:], prog="longturn params")
    if args and args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    print(USAGE, file=sys.stderr)
    if args:
        print(f"longturn: error: unknown command '{args[0]}'", file=sys.stderr)
    return 2
