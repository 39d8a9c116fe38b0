"""Stage report: zero-shot vs final per task, training curves, KL think vs action (data/report)."""

from __future__ import annotations

import sys

if not __package__:  # run as a file: one line when this Python lacks longturn
    import python_check  # noqa: F401

from components.common import parser, run
from longturn.report.build import build_report


def body(args, params) -> None:
    title_info = {
        "model.source": params.model.source,
        "rollout.protocol": params.rollout.protocol,
        "rollout.context": params.rollout.context,
        # the env the action protocol plays (chat tasks name their own)
        **({"env.name": params.env.name} if params.rollout.protocol == "action" else {}),
        "env.tasks": params.env.tasks,
        "eval.tasks": params.eval.tasks,
        "eval.episodes_per_task": params.eval.episodes_per_task,
        "algo.advantage": params.algo.advantage,
    }
    build_report(args.zero_shot, args.final, args.train_live, args.warmup_live, args.out,
                 title_info, critic=params.algo.estimator.has_critic)


def main(argv=None) -> int:
    p = parser(__doc__)
    p.add_argument("--zero-shot", default="data/eval/zero_shot", help="zero-shot eval folder")
    p.add_argument("--final", default="data/eval/final", help="final eval folder")
    p.add_argument("--train-live", default="data/train/live", help="DVCLive folder of train")
    p.add_argument("--warmup-live", default="data/critic/live",
                   help="DVCLive folder of critic_warmup")
    p.add_argument("--out", default="data/report")
    return run("report", body, p, argv)


if __name__ == "__main__":
    sys.exit(main())
