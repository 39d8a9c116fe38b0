"""Benchmark: vectorised dual-discount GAE vs a per-token Python loop.

Batch of the GPU profile: 32 slots × 8 turns × 512 response tokens (131,072 tokens).
Both run in the same process; the median of several repeats is printed with the
speed-up ratio, and the two results must agree. Run: .venv/bin/python bench/gae.py
[--threads N] [--tiny]. Torch uses every core this process may run on unless --threads says
otherwise (the loop is single-threaded either way; on a shared, busy CPU, --threads 1 keeps torch's
intra-op pool from stalling on every op and measuring the neighbours). --tiny: 4 slots × 4 turns × 64 tokens,
3 repeats (a smoke run in well under a second, not a measurement).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from longturn.algo.gae import GAEParams, dual_discount_gae  # noqa: E402
from cpu_threads import add_threads_arg, use_threads  # noqa: E402
from tiny_model import fill_defaults  # noqa: E402

FULL = {"slots": 32, "turns": 8, "tokens": 512, "repeats": 11}
TINY = {"slots": 4, "turns": 4, "tokens": 64, "repeats": 3}


def loop_gae(values: list[float], rewards: list[float], lengths: list[int],
             next_values: list[float], carries: list[float], p: GAEParams) -> list[float]:
    """The §5 rule token by token, newest first (plain Python floats)."""
    adv = [0.0] * len(values)
    end, carried = len(values), 0.0
    for t in range(len(lengths) - 1, -1, -1):
        start = end - lengths[t]
        last = end - 1
        a = (rewards[last] + p.gamma_step * next_values[t] - values[last]
             + p.gamma_step * p.lambda_step * carries[t] * carried)
        adv[last] = a
        for k in range(last - 1, start - 1, -1):
            a = rewards[k] + p.gamma_token * values[k + 1] - values[k] \
                + p.gamma_token * p.lambda_token * a
            adv[k] = a
        carried, end = a, start
    return adv


def median_time(fn: Callable[[], object], repeats: int) -> tuple[float, float, object]:
    """Median and min wall time over `repeats` calls after one warm-up, and the result."""
    out, times = fn(), []  # warm-up: torch's thread pool and allocator
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_threads_arg(parser)
    for name in FULL:
        parser.add_argument(f"--{name}", type=int, default=None,
                            help=f"default {FULL[name]} (--tiny {TINY[name]})")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: a smoke run")
    args = fill_defaults(parser.parse_args(), FULL, TINY)
    if min(args.slots, args.turns, args.tokens, args.repeats) < 1:
        parser.error("--slots, --turns, --tokens and --repeats must be >= 1")
    return args


def main() -> None:
    args = parse_args()
    use_threads(args.threads)
    rng = np.random.default_rng(0)
    n_turns, tokens, repeats = args.slots * args.turns, args.tokens, args.repeats
    values, rewards = rng.normal(size=n_turns * tokens), rng.normal(size=n_turns * tokens)
    lengths = np.full(n_turns, tokens)
    next_values = rng.normal(size=n_turns)
    carries = np.tile(np.r_[np.ones(args.turns - 1), 0.0], args.slots)  # cut at each slot's end
    p = GAEParams(0.99, 0.95, 1.0, 0.98)
    lists = (values.tolist(), rewards.tolist(), lengths.tolist(),
             next_values.tolist(), carries.tolist())
    t_vec, min_vec, (adv, _) = median_time(
        lambda: dual_discount_gae(values, rewards, lengths, next_values, carries, p), repeats)
    t_loop, min_loop, ref = median_time(lambda: loop_gae(*lists, p), repeats)
    np.testing.assert_allclose(adv.numpy(), np.asarray(ref), rtol=1e-9, atol=1e-9)
    print(f"dual-discount GAE, {n_turns} turns x {tokens} tokens = {values.size} tokens, "
          f"{repeats} repeats, torch threads={torch.get_num_threads()}")
    print(f"  python per-token loop : median {t_loop * 1e3:8.2f} ms   min {min_loop * 1e3:8.2f} ms")
    print(f"  vectorised (scan)     : median {t_vec * 1e3:8.2f} ms   min {min_vec * 1e3:8.2f} ms")
    print(f"  speed-up (median)     : {t_loop / t_vec:8.1f}x   (results agree, atol 1e-9)")


if __name__ == "__main__":
    main()
