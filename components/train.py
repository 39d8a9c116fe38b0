"""Stage train: iterations of rollout → Parquet → PPO update (resumable), final actor to data/train/final.

    python components/train.py                                   # train (or resume)
    python components/train.py --replay data/train/trajectories/iteration=0003   # update only
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from components.common import parser, run
from longturn.algo.group_advantages import needs_critic
from longturn.models import check_model_dir
from longturn.training import TrainPaths, replay_update, run_training


def body(args, params) -> None:
    check_model_dir(args.model_dir)
    if needs_critic(params.algo.advantage):  # grpo / gigpo: the warm-up stage wrote only a note
        check_model_dir(args.critic_dir, tokenizer=False)
    out = Path(args.out)
    paths = TrainPaths(base=Path(args.model_dir), critic=Path(args.critic_dir),
                       trajectories=out / "trajectories", checkpoints=out / "checkpoints",
                       final=out / "final", live=out / "live", policy=out / "policy")
    if args.replay:
        print(json.dumps(replay_update(params, paths, Path(args.replay)), sort_keys=True))
    else:
        run_training(params, paths)


def main(argv=None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--model-dir", default="data/models/base")
    p.add_argument("--critic-dir", default="data/critic/warm")
    p.add_argument("--out", default="data/train")
    p.add_argument("--replay", default=None, help="an iteration=NNNN dir: run its update alone")
    return run("train", body, p, argv)


if __name__ == "__main__":
    sys.exit(main())
