"""Rollout throughput: the same episodes played with N envs batched vs one env at a time; and N
slots' envs stepping in worker processes (`env.workers: true`) vs in this process. Both play the
action protocol's conversations of the env (`ConversationRun.of_env`), as evaluation and the
train rollout do.

Prints turns/s for each and the ratios, measured side by side in one run. The workers line times
fixed-turn collection (the train rollout) after the slots' first episodes are open; the workers'
start-up is printed apart (once per stage). It is measured twice: with the model generating, and
with a canned reply instead (env stepping and prompt rendering only, where the overlap shows). Uses the
prepared base model (run `make repro` or the prepare_model stage first) and the
env/prompt/engine params. --tiny plays 2 episodes of 2 turns with 8 new tokens on the tiny random
model (bench/tiny_model.py): a smoke run in seconds, not a measurement.

    .venv/bin/python bench/rollout_throughput.py [--envs 8] [--turns 6] [--model-dir DIR]
        [--tiny [--tiny-dir DIR]]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from longturn.rollout.conversation_player import conversation_fixed_turns  # noqa: E402
from longturn.rollout.conversation_setup import ConversationRun  # noqa: E402
from longturn.params.config import Params, load_params  # noqa: E402
from longturn.engines.base import Completion  # noqa: E402
from longturn.engines.registry import make_engine, sampling_from_params  # noqa: E402
from longturn.run.evaluation import eval_jobs  # noqa: E402
from longturn.run.models import load_tokenizer  # noqa: E402
from longturn.rollout.conversation_episodes import play_episode_jobs  # noqa: E402
from cpu_threads import add_threads_arg, use_threads  # noqa: E402
from tiny_model import add_tiny_args, fill_defaults, resolve_model_dir  # noqa: E402

FULL = {"envs": 8, "turns": 6, "new_tokens": None}
TINY = {"envs": 2, "turns": 2, "new_tokens": 8}


def timed_play(engine, tokenizer, params, jobs, parallel: int) -> tuple[int, float]:
    """Turns played and wall seconds for `jobs` with `parallel` envs in lock-step."""
    run = ConversationRun.of_env(params, progress=False)
    start = time.perf_counter()
    samples, _ = play_episode_jobs(run, engine, tokenizer, jobs, parallel,
                                   sampling_from_params(params, seed=0), progress=False)
    return len(samples), time.perf_counter() - start  # a sample per turn


def with_workers(params: Params, workers: bool) -> Params:
    """The params with env.workers set (no step timeout in process: it cannot be enforced)."""
    timeout = (params.env.step_timeout_s or 60.0) if workers else None
    env = params.env.model_copy(update={"workers": workers, "step_timeout_s": timeout})
    return params.model_copy(update={"env": env})


class CannedEngine:
    """Answers every prompt with the same reply at once (an action the env does not know runs its
    default): what is left is env stepping and prompt rendering."""

    def __init__(self, tokenizer) -> None:
        self.ids = tokenizer("THINK: keep going.\nACTION: go forward",
                             add_special_tokens=False)["input_ids"]

    def generate(self, prompts, sampling):
        return [Completion(list(self.ids), [0.0] * len(self.ids), "stop") for _ in prompts]


def timed_collect(engine, tokenizer, params: Params, envs: int, turns: int,
                  workers: bool) -> tuple[int, float, float]:
    """(turns, seconds of collection, seconds to open the slots' first episodes) of one
    fixed-turn rollout."""
    p = with_workers(params, workers)
    start = time.perf_counter()
    collector = conversation_fixed_turns(ConversationRun.of_env(p, progress=False),
                                         list(p.env.tasks), envs, turns, seed=0)
    try:
        collector.start_idle()  # every slot's env built (its worker started) and reset
        started = time.perf_counter()
        samples = collector.collect(engine, tokenizer, sampling_from_params(p, seed=0), 0,
                                 progress=False)
    finally:
        collector.close()  # a slot whose env never starts must leave no worker behind
    return len(samples), time.perf_counter() - started, started - start


def workers_lines(engine, tokenizer, params: Params, envs: int, turns: int, label: str) -> None:
    n_w, t_w, up_w = timed_collect(engine, tokenizer, params, envs, turns, workers=True)
    n_l, t_l, up_l = timed_collect(engine, tokenizer, params, envs, turns, workers=False)
    print(f"  {label}: workers {n_w / t_w:8.2f} turns/s, in-process {n_l / t_l:8.2f} turns/s, "
          f"ratio workers / in-process {(n_w / t_w) / (n_l / t_l):.2f}x "
          f"(first episodes open in {up_w:.1f} s with workers, {up_l:.1f} s in process)")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--model-dir", default=str(ROOT / "data/models/base"))
    ap.add_argument("--envs", type=int, default=None,
                    help=f"episodes, and envs in the batched run ({FULL['envs']}; --tiny "
                         f"{TINY['envs']})")
    ap.add_argument("--turns", type=int, default=None,
                    help=f"turns per episode, env.max_turns ({FULL['turns']}; --tiny "
                         f"{TINY['turns']})")
    ap.add_argument("--new-tokens", type=int, default=None,
                    help="max new tokens per turn (engine.sampling.max_new_tokens; --tiny "
                         f"{TINY['new_tokens']})")
    ap.add_argument("--task", default="goto")
    add_threads_arg(ap)
    add_tiny_args(ap)
    args = fill_defaults(ap.parse_args(), FULL, TINY)
    if args.envs < 1 or args.turns < 1:
        ap.error("--envs and --turns must be >= 1")
    return args


def run(args: argparse.Namespace, model_dir: str) -> None:
    params = load_params(args.params)
    params.env.max_turns = args.turns
    params.engine.batch_size = args.envs
    if args.new_tokens:
        params.engine.sampling.max_new_tokens = args.new_tokens
    threads = use_threads(args.threads)
    tokenizer = load_tokenizer(model_dir)
    engine = make_engine(model_dir, params)
    jobs = eval_jobs([args.task], args.envs, base_seed=0)
    timed_play(engine, tokenizer, params, jobs[:1], 1)  # warm-up: first-call allocations
    n_batched, t_batched = timed_play(engine, tokenizer, params, jobs, args.envs)
    n_single, t_single = timed_play(engine, tokenizer, params, jobs, 1)
    batched, single = n_batched / t_batched, n_single / t_single
    print(f"{args.envs} episodes of task {args.task!r}, up to {args.turns} turns each, "
          f"{params.engine.name} engine, {params.model.dtype}, "
          f"{params.engine.sampling.max_new_tokens} new tokens max, torch threads={threads}")
    print(f"  batched ({args.envs} envs in lock-step): {n_batched:4d} turns in {t_batched:7.1f} s "
          f"= {batched:6.2f} turns/s")
    print(f"  one env at a time            : {n_single:4d} turns in {t_single:7.1f} s "
          f"= {single:6.2f} turns/s")
    print(f"  ratio batched / one-at-a-time: {batched / single:.2f}x")
    print(f"{args.envs} env slots x {args.turns} lock-steps of fixed-turn collection, "
          f"env.workers true vs false:")
    workers_lines(engine, tokenizer, params, args.envs, args.turns, "with the model ")
    workers_lines(CannedEngine(tokenizer), tokenizer, params, args.envs, args.turns * 8,
                  "canned replies ")
    engine.close()


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(args, resolve_model_dir(args, tmp))


if __name__ == "__main__":
    main()
