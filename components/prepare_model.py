"""Stage prepare_model: materialise the base model as a Hugging Face dir (data/models/base)."""

from __future__ import annotations

import logging
import sys

if not __package__:  # run as a file: one line when this Python lacks longturn
    import python_check  # noqa: F401

from components.common import parser, run
from longturn.run.models import prepare_base_model

log = logging.getLogger("prepare_model")


def body(args, params) -> None:
    out = prepare_base_model(params.model.source, args.out)
    log.info("base model %r ready at %s", params.model.source, out)


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--out", default="data/models/base", help="output HF dir")
    return run("prepare_model", body, p, argv)


if __name__ == "__main__":
    sys.exit(main())
