"""Rollout throughput: the same episodes played with N envs batched vs one env at a time.

Prints turns/s for each and the ratio, measured side by side in one run. Uses the prepared base
model (run `make repro` or the prepare_model stage first) and the env/prompt/engine params.

    .venv/bin/python bench/rollout_throughput.py [--envs 8] [--turns 6] [--model-dir DIR]
"""

from __future__ import annotations

import argparse
import time

from longturn.config import load_params
from longturn.engines.registry import make_engine, sampling_from_params
from longturn.evaluation import eval_jobs
from longturn.models import load_tokenizer
from longturn.rollout import AgentSettings, env_factory_from_params, play_episodes


def timed_play(engine, tokenizer, params, jobs, parallel: int) -> tuple[int, float]:
    settings = AgentSettings.from_params(params)
    start = time.perf_counter()
    turns, _ = play_episodes(engine, tokenizer, env_factory_from_params(params), jobs, parallel,
                             sampling_from_params(params, seed=0), settings, progress=False)
    return len(turns), time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--model-dir", default="data/models/base")
    ap.add_argument("--envs", type=int, default=8, help="episodes, and envs in the batched run")
    ap.add_argument("--turns", type=int, default=6, help="turns per episode (env.max_turns)")
    ap.add_argument("--task", default="goto")
    args = ap.parse_args()

    params = load_params(args.params)
    params.env.max_turns = args.turns
    params.engine.batch_size = args.envs
    tokenizer = load_tokenizer(args.model_dir)
    engine = make_engine(args.model_dir, params)
    jobs = eval_jobs([args.task], args.envs, base_seed=0)
    timed_play(engine, tokenizer, params, jobs[:1], 1)  # warm-up: first-call allocations
    n_batched, t_batched = timed_play(engine, tokenizer, params, jobs, args.envs)
    n_single, t_single = timed_play(engine, tokenizer, params, jobs, 1)
    engine.close()
    batched, single = n_batched / t_batched, n_single / t_single
    print(f"{args.envs} episodes of task {args.task!r}, up to {args.turns} turns each, "
          f"{params.engine.name} engine, {params.model.dtype}")
    print(f"  batched ({args.envs} envs in lock-step): {n_batched:4d} turns in {t_batched:7.1f} s "
          f"= {batched:6.2f} turns/s")
    print(f"  one env at a time            : {n_single:4d} turns in {t_single:7.1f} s "
          f"= {single:6.2f} turns/s")
    print(f"  ratio batched / one-at-a-time: {batched / single:.2f}x")


if __name__ == "__main__":
    main()
