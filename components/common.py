"""What every stage script shares: `--params`, logging, and turning known errors into one line.

Known errors: `UserError`s (a setting, a path, a gate, the disk), and a disk that is full,
read-only or not ours wherever the write happened. Anything else keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable, Sequence

from longturn.atomic import disk_error
from longturn.config import Params, ParamsError, load_params
from longturn.errors import UserError

# User errors of modules this file must not import: each import would make every stage depend on
# that module in dvc.yaml (tests/test_dvc_deps.py). An error whose module the stage never
# imported cannot have been raised, so they are looked up among the modules already loaded.
# An entry can go once its class subclasses UserError.
LAZY_USER_ERRORS = (("longturn.agent.prompts", "PromptTooLong"),
                    ("longturn.engines.sglang_server", "SGLangError"))


def user_error_types() -> tuple[type[BaseException], ...]:
    """UserError, ParamsError, and the lazily looked-up classes of modules loaded so far."""
    lazy = (getattr(sys.modules.get(module), name, None) for module, name in LAZY_USER_ERRORS)
    return (UserError, ParamsError, *(cls for cls in lazy if isinstance(cls, type)))


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    return p


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run(stage: str, body: Callable[[argparse.Namespace, Params], int | None],
        arg_parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse args, validate params, run the stage; a bad input is one line on stderr, exit 2."""
    args = arg_parser.parse_args(argv)
    setup_logging()
    try:
        params = load_params(args.params)
        return int(body(args, params) or 0)
    except Exception as err:  # noqa: BLE001 - sorted below; unknown errors are re-raised
        line = one_line(err, getattr(args, "out", None) or ".")
        debug = os.environ.get("LONGTURN_DEBUG") and not isinstance(err, user_error_types())
        if line is None or debug:
            raise
        print(f"{stage}: error: {line}", file=sys.stderr)
        return 2


def one_line(err: Exception, out: str) -> str | None:
    """The one line to print for a known error, or None for a bug (keep the traceback).

    A ValueError names the bad value (env and engine lookups, constructor checks) but may be a
    bug: its line says how to see the traceback. Any other failure while the output's disk is
    full or read-only is that disk's fault."""
    if isinstance(err, user_error_types()):
        return str(err)
    named = disk_error(out, err)
    if named is not None:
        return str(named)
    if isinstance(err, ValueError):
        return f"{err}\n(set LONGTURN_DEBUG=1 for the traceback)"
    return None
