"""What every stage script shares: `--params`, logging, and turning known errors into one line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable, Sequence

from longturn.agent.prompts import PromptTooLong
from longturn.config import Params, ParamsError, load_params
from longturn.engines.sglang_server import SGLangError
from longturn.errors import UserError
from longturn.models import ModelSourceError
from longturn.warmup import WarmupDidNotConverge

# Errors whose message says what to change; anything else keeps its traceback.
USER_ERRORS = (UserError, ParamsError, ModelSourceError, PromptTooLong, WarmupDidNotConverge,
               SGLangError)


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
    except USER_ERRORS as err:
        print(f"{stage}: error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # env/engine lookups and constructor checks name the bad value
        if os.environ.get("LONGTURN_DEBUG"):
            raise
        print(f"{stage}: error: {err}\n(set LONGTURN_DEBUG=1 for the traceback)", file=sys.stderr)
        return 2
