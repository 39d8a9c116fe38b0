"""Stage zero_shot_eval: evaluate the base model on the eval tasks (data/eval/zero_shot)."""

from __future__ import annotations

import sys

if not __package__:  # run as a file: one line when this Python lacks longturn
    import python_check  # noqa: F401

from components.common import parser, run
from longturn.run.preflight import preflight
from longturn.run.protocol import evaluate_model
from longturn.run.models import check_model_dir


def body(args, params) -> None:
    check_model_dir(args.model_dir)
    evaluate_model(args.model_dir, params, args.out, policy_version=args.policy_version)


def main(argv=None, stage: str = "zero_shot_eval") -> int:
    """`stage` names the stage in its log lines: final_eval runs this same body."""
    p = parser(__doc__)
    p.add_argument("--model-dir", default="data/models/base")
    p.add_argument("--out", default="data/eval/zero_shot")
    p.add_argument("--policy-version", default="base", help="label stored in every row")
    return run(stage, body, p, argv, checks=preflight)


if __name__ == "__main__":
    sys.exit(main())
