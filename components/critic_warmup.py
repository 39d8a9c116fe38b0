"""Stage critic_warmup: fit the critic to the frozen base policy (data/critic/warm).

Above `warmup.max_final_loss` it exits 2 and writes no critic, so train cannot start from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: one line when this Python lacks longturn
    import python_check  # noqa: F401

from components.common import parser, run
from longturn.run.preflight import preflight
from longturn.atomic import write_json
from longturn.run.models import check_model_dir
from longturn.run.warmup import run_critic_warmup


def body(args, params) -> None:
    check_model_dir(args.model_dir)
    summary = run_critic_warmup(params, Path(args.model_dir), Path(args.out), Path(args.live),
                                Path(args.work), progress=True)
    write_json(args.metrics, summary)


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--model-dir", default="data/models/base")
    p.add_argument("--out", default="data/critic/warm")
    p.add_argument("--live", default="data/critic/live", help="DVCLive dir of the loss curve")
    p.add_argument("--work", default="data/critic/batches", help="Parquet of each warm-up update")
    p.add_argument("--metrics", default="data/critic/metrics.json")
    return run("critic_warmup", body, p, argv, checks=preflight)


if __name__ == "__main__":
    sys.exit(main())
