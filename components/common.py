"""What every stage script shares: `--params`, logging, and turning known errors into one line.

Known errors: `UserError`s (a setting, a path, a gate, the disk; library code raises them for
mistakes a user can fix), and a disk that is full, read-only or not ours wherever the write
happened. Anything else, a ValueError from deep inside torch included, keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Callable, Sequence

from longturn.atomic import disk_error
from longturn.params.config import Params, load_params
from longturn.errors import UserError


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    return p


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


Checks = Callable[[Params, "str | None"], None]


def run(stage: str, body: Callable[[argparse.Namespace, Params], int | None],
        arg_parser: argparse.ArgumentParser, argv: Sequence[str] | None = None,
        checks: Checks | None = None) -> int:
    """Parse args, validate params and, with `checks` (`longturn.run.preflight.preflight` for the
    stages that play envs), what they name and the model's context before any model loads; run
    the stage; a bad input is one line on stderr, exit 2. Stages that play no env pass no
    checks, so they do not import (and DVC does not rerun them for) the env and engine code."""
    args = arg_parser.parse_args(argv)
    setup_logging()
    start = time.time()
    try:
        params = load_params(args.params)
        if checks is not None:
            checks(params, getattr(args, "model_dir", None))
        code = int(body(args, params) or 0)
    except Exception as err:  # noqa: BLE001 - sorted below; unknown errors are re-raised
        line = one_line(err, getattr(args, "out", None) or ".")
        if line is None or os.environ.get("LONGTURN_DEBUG"):  # debugging: every traceback
            raise
        print(f"{stage}: error: {line}", file=sys.stderr)
        return 2
    if code == 0:
        # the last line, printed before the interpreter's teardown: a runner that sees it knows
        # the outputs are written even if the process then fails to exit (bench/gpu_campaign.py)
        print(f"{stage}: finished in {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    return code


def one_line(err: Exception, out: str) -> str | None:
    """The one line to print for a known error, or None for a bug (keep the traceback).

    A UserError says what to change. Any other failure while the output's disk is full or
    read-only is that disk's fault."""
    if isinstance(err, UserError):
        return str(err)
    named = disk_error(out, err)
    return None if named is None else str(named)
