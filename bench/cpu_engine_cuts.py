"""What each of the in-process engine's CPU cuts buys, side by side on one batch of real prompts.

Why: on a 2-core CPU, generation is most of an evaluation and a third of a training iteration.
Four cuts target it: the shared prefix's K/V kept across calls while the weights stand (an
evaluation plays every turn with the same system prompt), prompt tails prefilled in chunks of
like width (less padding), prefill attention by torch's fused kernel, and stopped rows dropped
from the decode batch. This times one
engine with none of them ("before"), each alone, and all of them, alternating the variants
round by round so a neighbour's load hits them alike, and checks they all sample the same tokens.

How: --calls seeded generate() calls per round on the same --rows prompts (the collector's
turn-0 prompts of params.yaml's env, so tails vary less than in later turns, where history makes
them uneven), up to --new-tokens each; the median seconds per call of each variant over --rounds
rounds, and its speed-up over "before". Toggles: kept prefix off = the held prefix forgotten
before every call; chunked prefill off = `PREFILL_FILL` 0 (one chunk); fused attention off =
`static_kv.FUSED_PREFILL` False (the cascade's products); dropping off = `DROP_AT` 0.

    .venv/bin/python bench/cpu_engine_cuts.py [--rows 16] [--calls 4] [--rounds 3]
        [--model-dir data/models/base] [--dtype float32] [--threads N] [--tiny [--tiny-dir DIR]]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

import longturn.engines.static_decoder as static_decoder  # noqa: E402
import longturn.engines.static_kv as static_kv  # noqa: E402
from agent_prompts import collector_prompts  # noqa: E402
from longturn.params.config import load_params  # noqa: E402
from longturn.engines.base import SamplingParams  # noqa: E402
from longturn.engines.hf import HFEngine  # noqa: E402
from longturn.engines.shared_prefix import shared_prefix_length  # noqa: E402
from cpu_threads import add_threads_arg, use_threads  # noqa: E402
from tiny_model import add_tiny_args, fill_defaults, resolve_model_dir  # noqa: E402

FULL = {"rows": 16, "calls": 4, "rounds": 3, "new_tokens": 48}
TINY = {"rows": 4, "calls": 2, "rounds": 1, "new_tokens": 8}
CUTS = ("kept prefix", "chunked prefill", "fused prefill attention", "dropped rows")
VARIANTS = {"before": (), **{f"+ {cut}": (cut,) for cut in CUTS}, "all four": CUTS}


@contextmanager
def cuts_on(engine: HFEngine, cuts: tuple[str, ...]) -> Iterator[None]:
    """The engine with only `cuts` in effect."""
    saved = static_decoder.PREFILL_FILL, static_decoder.DROP_AT, static_kv.FUSED_PREFILL
    static_kv.FUSED_PREFILL = "fused prefill attention" in cuts
    if "chunked prefill" not in cuts:
        static_decoder.PREFILL_FILL = 0.0
    if "dropped rows" not in cuts:
        static_decoder.DROP_AT = 0.0
    try:
        yield
    finally:
        static_decoder.PREFILL_FILL, static_decoder.DROP_AT, static_kv.FUSED_PREFILL = saved


def forget_prefix(engine: HFEngine) -> None:
    """The next call runs its prefix again (the buffers stay: no allocation is timed)."""
    held = engine._decoder.prefixes
    for capacity, (buffers, _) in list(held.items()):
        held[capacity] = (buffers, None)


def one_round(engine: HFEngine, prompts: list[list[int]], cuts: tuple[str, ...],
              args: argparse.Namespace) -> tuple[list[float], list[list[list[int]]]]:
    """Seconds of each of --calls calls and their tokens."""
    times, tokens = [], []
    with cuts_on(engine, cuts):
        for call in range(args.calls):
            if "kept prefix" not in cuts:
                forget_prefix(engine)
            sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.7, top_p=1.0,
                                      top_k=0, seed=100 + call)
            start = time.perf_counter()
            out = engine.generate(prompts, sampling)
            times.append(time.perf_counter() - start)
            tokens.append([c.token_ids for c in out])
    return times, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--model-dir", default=str(ROOT / "data" / "models" / "base"))
    ap.add_argument("--rows", type=int)
    ap.add_argument("--calls", type=int)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--new-tokens", type=int)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    add_threads_arg(ap)
    add_tiny_args(ap)
    args = fill_defaults(ap.parse_args(), FULL, TINY)
    use_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        engine = HFEngine(resolve_model_dir(args, tmp), dtype=args.dtype, device="cpu")
        prompts = collector_prompts(load_params(args.params), engine.tokenizer, args.rows)
        lengths = [len(p) for p in prompts]
        print(f"{len(prompts)} prompts of {min(lengths)}-{max(lengths)} tokens (shared prefix "
              f"{shared_prefix_length(prompts)}); {args.calls} seeded calls per round, up to "
              f"{args.new_tokens} new tokens; {args.dtype} on the CPU; median s per call over "
              f"{args.rounds} round(s), variants alternating, after one untimed round")
        one_round(engine, prompts, (), args)  # warm-up: allocations, kernel choice
        seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
        outputs: dict[str, list] = {}
        for _ in range(args.rounds):
            for name, cuts in VARIANTS.items():
                times, tokens = one_round(engine, prompts, cuts, args)
                seconds[name] += times
                outputs[name] = tokens
    before = statistics.median(seconds["before"])
    for name, times in seconds.items():
        median = statistics.median(times)
        same = "same tokens" if outputs[name] == outputs["before"] else "OTHER TOKENS"
        print(f"  {name:25s}: {median:7.3f} s per call   x{before / median:5.2f}   ({same})")


if __name__ == "__main__":
    main()
