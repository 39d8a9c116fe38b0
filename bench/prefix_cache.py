"""Benchmark: HFEngine.generate with shared-prefix prefill on vs off.

Workload of the CPU profile: 16 chat prompts that share a 300-token prefix (system prompt + worked
example) and end in 150 distinct tokens (goal + observation + answer format), 32 new tokens each,
sampled at temperature 1 with a fixed seed, bf16. One engine, the flag toggled between calls;
runs alternate (off, on, off, on, ...) so load from neighbours hits both alike. Prints
median / min wall times, the speed-up, and how well the outputs agree (same seed: the tokens match
unless bf16 noise flips a draw), then checks in float32 on a few prompts that sharing changes
nothing: same tokens, logprobs within 1e-4 (exit status 1 if not). Needs the converted model
(`make repro`) or --model-dir, or --tiny: the tiny random model (bench/tiny_model.py), 4 prompts,
4 new tokens, one repeat, the float32 check on 2 prompts (a smoke run in seconds, not a
measurement). Run: .venv/bin/python bench/prefix_cache.py [--threads N] [--repeats R]
[--tiny [--tiny-dir DIR]]. Torch uses every core this process may run on unless --threads says
otherwise (on a shared, busy CPU torch's intra-op pool can stall and the timings then measure the
neighbours: pass --threads 1 to compare).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from longturn.engines.base import Completion, SamplingParams  # noqa: E402
from longturn.engines.hf import HFEngine  # noqa: E402
from longturn.engines.shared_prefix import shared_prefix_length  # noqa: E402
from cpu_threads import add_threads_arg, use_threads  # noqa: E402
from tiny_model import add_tiny_args, fill_defaults, resolve_model_dir  # noqa: E402

FULL = {"prompts": 16, "prefix_tokens": 300, "suffix_tokens": 150, "new_tokens": 32, "repeats": 3,
        "check_prompts": 4}
TINY = {"prompts": 4, "new_tokens": 4, "repeats": 1, "check_prompts": 2}

ACTIONS = {
    "turn left": "turn 90 degrees to the left", "turn right": "turn 90 degrees to the right",
    "go forward": "move one step forward", "pick up": "pick up the object in front of you",
    "drop": "drop the object you carry", "toggle": "open or close the door in front of you",
}
OBJECTS = ["red ball", "blue key", "green box", "yellow door", "grey wall", "purple ball"]
WHERE = ["1 step forward", "2 steps left", "3 steps right", "4 steps forward", "right in front"]


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def filler_ids(tokenizer, rng: random.Random, template: str, n: int) -> list[int]:
    """Exactly n tokens of random lines like `template` (slots: object, place, action)."""
    ids: list[int] = []
    while len(ids) < n:
        line = template.format(o=rng.choice(OBJECTS), w=rng.choice(WHERE),
                               a=rng.choice(list(ACTIONS)))
        ids += encode(tokenizer, line)
    return ids[:n]


def prefix_ids(tokenizer, n: int) -> list[int]:
    """Exactly n tokens common to all prompts: system prompt (tips cut to fit), worked exchange."""
    actions = ",\n".join(f"{name}: {desc}" for name, desc in ACTIONS.items())
    head = encode(tokenizer, "<|im_start|>system\nYou are an agent in a text game. These are the "
                  f"actions you can take:\n{actions}.\n\nTips:\n")
    tail = encode(tokenizer, "PLAY!<|im_end|>\n<|im_start|>user\nYour goal: go to the red ball.\n"
                  "Current observation:\nYou see a red ball 2 steps forward.<|im_end|>\n"
                  "<|im_start|>assistant\nTHINK: The ball is ahead.\nACTION: go forward"
                  "<|im_end|>\n")
    room = n - len(head) - len(tail)
    if room < 0:
        raise ValueError(f"the shared prompt needs at least {len(head) + len(tail)} tokens")
    tips = filler_ids(tokenizer, random.Random(-1), "- look for the {o} before you {a}.\n", room)
    return head + tips + tail


def suffix_ids(tokenizer, index: int, n: int) -> list[int]:
    """Exactly n tokens of one distinct current turn: goal, observation, answer format."""
    head = encode(tokenizer, f"<|im_start|>user\nTurn {index}. Your goal: pick up the "
                  f"{OBJECTS[index % len(OBJECTS)]}.\nCurrent observation:\n")
    tail = encode(tokenizer, "\n\nAnswer in exactly this format:\nTHINK: <one short sentence>\n"
                  "ACTION: <one action><|im_end|>\n<|im_start|>assistant\n")
    body = filler_ids(tokenizer, random.Random(index), "You see a {o} {w}.\n",
                      n - len(head) - len(tail))
    return head + body + tail


def build_prompts(tokenizer, n: int, prefix_len: int, suffix_len: int) -> list[list[int]]:
    """n prompts: the same prefix_len tokens, then suffix_len tokens of a distinct current turn."""
    prefix = prefix_ids(tokenizer, prefix_len)
    return [prefix + suffix_ids(tokenizer, i, suffix_len) for i in range(n)]


def timed(engine: HFEngine, prompts: list[list[int]], sampling: SamplingParams):
    """Wall seconds of one generate call, and its completions."""
    t0 = time.perf_counter()
    out = engine.generate(prompts, sampling)
    return time.perf_counter() - t0, out


def agreement(plain: list[Completion], shared: list[Completion]) -> tuple[int, float]:
    """Completions with identical tokens, and max |logprob difference| where the tokens agree."""
    same, worst = 0, 0.0
    for a, b in zip(plain, shared):
        same += a.token_ids == b.token_ids
        for ta, tb, la, lb in zip(a.token_ids, b.token_ids, a.logprobs, b.logprobs):
            if ta != tb:
                break
            worst = max(worst, abs(la - lb))
    return same, worst


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default=str(ROOT / "data/models/base"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--prefix-tokens", type=int, default=None)
    parser.add_argument("--suffix-tokens", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per setting")
    add_threads_arg(parser)
    parser.add_argument("--check-prompts", type=int, default=None,
                        help="prompts for the float32 equality check (0: skip it)")
    add_tiny_args(parser)
    return fill_defaults(parser.parse_args(), FULL, TINY)


def time_both(engine: HFEngine, prompts: list[list[int]], sampling: SamplingParams,
              repeats: int) -> tuple[dict[str, list[float]], dict[str, list[Completion]]]:
    """Alternating off/on calls (neighbours' load hits both alike): times and last outputs."""
    warm_up = SamplingParams(max_new_tokens=2, temperature=1.0, top_p=1.0, top_k=0, seed=0)
    timed(engine, prompts[:2], warm_up)
    times: dict[str, list[float]] = {"off": [], "on": []}
    outputs: dict[str, list[Completion]] = {}
    for _ in range(repeats):
        for name in ("off", "on"):
            engine.prefix_sharing = name == "on"
            seconds, outputs[name] = timed(engine, prompts, sampling)
            times[name].append(seconds)
    return times, outputs


def float32_check(model_dir: str, prompts: list[list[int]], new_tokens: int) -> bool:
    """In float32 sharing must not change the result: same tokens (greedy and seeded), logprobs
    within 1e-4. bf16 cannot show this: any change of batch layout moves its logits by ~0.1."""
    engine = HFEngine(model_dir, dtype="float32")
    ok = True
    for sampling in (SamplingParams(max_new_tokens=new_tokens, temperature=0.0, top_p=1.0,
                                    top_k=0, seed=None),
                     SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0,
                                    top_k=0, seed=0)):
        _, outputs = time_both(engine, prompts, sampling, repeats=1)
        same, worst = agreement(outputs["off"], outputs["on"])
        passed = same == len(prompts) and worst <= 1e-4
        ok &= passed
        print(f"  float32 check, {len(prompts)} prompts x {new_tokens} tokens, temperature "
              f"{sampling.temperature}: {same}/{len(prompts)} identical, max |d logprob| "
              f"{worst:.1e} -> {'ok' if passed else 'FAILED'}")
    return ok


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not run(args, resolve_model_dir(args, tmp)):
            sys.exit(1)


def run(args: argparse.Namespace, model_dir: str) -> bool:
    """Time sharing off vs on and print it; False if the float32 check fails."""
    use_threads(args.threads)
    engine = HFEngine(model_dir, dtype=args.dtype)
    prompts = build_prompts(engine.tokenizer, args.prompts, args.prefix_tokens, args.suffix_tokens)
    sampling = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, top_p=1.0, top_k=0,
                              seed=0)
    times, outputs = time_both(engine, prompts, sampling, args.repeats)
    same, worst = agreement(outputs["off"], outputs["on"])
    generated = sum(len(c.token_ids) for c in outputs["on"])
    print(f"{args.prompts} prompts x {len(prompts[0])} tokens (shared prefix "
          f"{shared_prefix_length(prompts)}), {args.new_tokens} new tokens max "
          f"({generated} generated), {args.dtype}, torch threads={torch.get_num_threads()}, "
          f"{args.repeats} repeats")
    for name in ("off", "on"):
        t = times[name]
        print(f"  {'prefix sharing ' + name:22s} : median {statistics.median(t):7.2f} s   "
              f"min {min(t):7.2f} s")
    speedup = statistics.median(times["off"]) / statistics.median(times["on"])
    print(f"  {'speed-up (median)':22s} : {speedup:7.2f}x")
    print(f"  {args.dtype + ' outputs':22s} : {same}/{len(prompts)} completions identical, "
          f"max |d logprob| on agreeing tokens {worst:.2e} (layout noise: see float32)")
    del engine
    if args.check_prompts:
        return float32_check(model_dir, prompts[:args.check_prompts], 8)
    return True


if __name__ == "__main__":
    main()
