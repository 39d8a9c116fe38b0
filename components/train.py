"""Stage train: iterations of rollout → Parquet → PPO update (resumable), final actor to data/train/final.

    python components/train.py                                   # train (or resume)
    python components/train.py --replay data/train/trajectories/iteration=0003   # update only
    python components/train.py --deadline EPOCH_S --profile-iteration 1          # as the GPU campaign
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if not __package__:  # run as a file: one line when this Python lacks longturn
    import python_check  # noqa: F401

from components.common import parser, run
from longturn.run.preflight import preflight
from longturn.run.headline import SUMMARY_FILE
from longturn.run.models import check_model_dir
from longturn.profiling import IterationProfiler
from longturn.run.training import Deadline, TrainPaths, replay_update, run_training


def body(args, params) -> None:
    check_model_dir(args.model_dir)
    if params.algo.estimator.has_critic:  # else the warm-up stage wrote only a note
        check_model_dir(args.critic_dir, tokenizer=False)
    out = Path(args.out)
    paths = TrainPaths(base=Path(args.model_dir), critic=Path(args.critic_dir),
                       trajectories=out / "trajectories", checkpoints=out / "checkpoints",
                       final=out / "final", live=out / "live", policy=out / "policy",
                       summary=out / SUMMARY_FILE)
    if args.replay:
        print(json.dumps(replay_update(params, paths, Path(args.replay)), sort_keys=True))
    else:
        deadline = Deadline(args.deadline) if args.deadline is not None else None
        profiler = (IterationProfiler(args.profile_iteration, args.profile_out)
                    if args.profile_iteration is not None else None)
        run_training(params, paths, deadline=deadline, profiler=profiler)


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--model-dir", default="data/models/base")
    p.add_argument("--critic-dir", default="data/critic/warm")
    p.add_argument("--out", default="data/train")
    p.add_argument("--replay", default=None, help="an iteration=NNNN dir: run its update alone")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds since the epoch: start no iteration that would end later; "
                        "checkpoint, export the actor marked PARTIAL.json, exit 0")
    p.add_argument("--profile-iteration", type=int, default=None,
                   help="run this iteration under torch.profiler (if this run reaches it)")
    p.add_argument("--profile-out", default="data/train/profile",
                   help="where the profiled iteration's trace.json.gz and phases.json go")
    return run("train", body, p, argv, checks=preflight)


if __name__ == "__main__":
    sys.exit(main())
