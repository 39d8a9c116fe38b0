"""Benchmark: the two parsers of model text at 1 kB, 10 kB and 100 kB, benign and adversarial.

Model text is hostile input: a reply the parsers take quadratic time on stalls a run. Both parsers
are linear by construction (docs/prompts-and-actions.md, docs/conversations.md); this prints the
median parse time of each reply shape at each size side by side, and the ratio of the largest
size to the smallest: a linear parser shows about the size ratio (100x), a quadratic one its
square. Goal: every 100 kB reply in at most 50 ms on the CPU.

Times are this process's CPU time (`time.process_time`), not wall time: on a shared machine a
10 ms parse is preempted by the neighbours and a 0.1 ms one is not, which bends the ratios.

- reply -> action: `ActionTranslator.parse` (THINK/ACTION split, normalising, synonym lookup)
  with BabyAI's table, what each reply of the action protocol runs;
- tool calls: `parse_tool_calls`, what each reply of the chat protocol runs.

Run: .venv/bin/python bench/parse_speed.py [--repeats N] [--tiny]. --tiny: 1 kB and 2 kB, one
repeat (a smoke run, not a measurement).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from longturn.envs.babyai import BabyAITextEnv  # noqa: E402
from longturn.envs.registry import translator_for  # noqa: E402
from longturn.tasks.tool_calls import CLOSE, OPEN, parse_tool_calls  # noqa: E402

KB = 1000
FULL = {"sizes": [1 * KB, 10 * KB, 100 * KB], "repeats": 7}
TINY = {"sizes": [1 * KB, 2 * KB], "repeats": 1}
GOAL_MS, GOAL_SIZE = 50.0, 100 * KB


def call(arguments: str) -> str:
    return f'{OPEN}{{"name": "calculator", "arguments": {arguments}}}{CLOSE}'


def repeat_to(piece: str, size: int, head: str = "", tail: str = "") -> str:
    """head + piece repeated + tail, `size` characters in all (the last piece cut)."""
    body = size - len(head) - len(tail)
    return head + (piece * (body // len(piece) + 1))[:max(body, 0)] + tail


# name -> reply of a given size; each adversarial shape is one that a naive parser is slow on
REPLIES: dict[str, Callable[[int], str]] = {
    "benign (THINK prose, one ACTION)": lambda n: repeat_to(
        "the key is two steps ahead and the door is left. ", n, "THINK: ", "\nACTION: go forward"),
    "many ACTION tags": lambda n: repeat_to("ACTION: turn left ", n),
    "one long ACTION line": lambda n: repeat_to("key ", n, "THINK: x\nACTION: pick up the "),
    "tag words before long spaces": lambda n: repeat_to("action" + " " * 50 + "think" + " " * 50,
                                                         n),
}
TOOL_CALLS: dict[str, Callable[[int], str]] = {
    "benign (prose and valid calls)": lambda n: repeat_to(
        "Let me compute that. " + call('{"expression": "12 * (7 + 5)"}') + " ", n),
    "unclosed <tool_call> tags": lambda n: repeat_to(OPEN, n),
    "calls nested 400 deep": lambda n: repeat_to(call("[" * 400 + "]" * 400) + " ", n),
    "calls with 500-digit numbers": lambda n: repeat_to(
        call('{"expression": %s}' % ("9" * 500)) + " ", n),
    "calls with strings of escapes": lambda n: repeat_to(
        call('{"expression": "%s"}' % ('\\"[{' * 200)) + " ", n),
}


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median CPU time in ms over `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1e3


def table(title: str, parse: Callable[[str], object], shapes: dict[str, Callable[[int], str]],
          sizes: list[int], repeats: int) -> float:
    """Print one parser's rows (ms per size, largest/smallest ratio); the worst time at the
    largest size."""
    heads = "".join(f"{f'{s // KB} kB':>11}" for s in sizes)
    print(f"{title}\n  {'reply':<34}{heads}   ratio {sizes[-1] // sizes[0]}x size")
    worst = 0.0
    for name, make in shapes.items():
        times = [median_ms(lambda text=make(size): parse(text), repeats) for size in sizes]
        worst = max(worst, times[-1])
        cells = "".join(f"{t:>8.2f} ms" for t in times)
        print(f"  {name:<34}{cells}   {times[-1] / max(times[0], 1e-6):8.1f}x")
    return worst


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"timed calls per cell, default {FULL['repeats']} "
                             f"(--tiny {TINY['repeats']})")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: a smoke run")
    args = parser.parse_args()
    preset = TINY if args.tiny else FULL
    args.sizes = preset["sizes"]
    args.repeats = preset["repeats"] if args.repeats is None else args.repeats
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def main() -> None:
    args = parse_args()
    translator = translator_for(BabyAITextEnv("goto"))
    print(f"CPU time per reply (median of {args.repeats}), one process\n")
    worst = table("reply -> action (ActionTranslator.parse, BabyAI)", translator.parse, REPLIES,
                  args.sizes, args.repeats)
    print()
    worst = max(worst, table("tool calls (parse_tool_calls)", parse_tool_calls, TOOL_CALLS,
                             args.sizes, args.repeats))
    largest = args.sizes[-1]
    verdict = ("met" if worst <= GOAL_MS else "NOT met") if largest == GOAL_SIZE else "not measured"
    print(f"\nslowest reply at {largest // KB} kB: {worst:.2f} ms "
          f"(goal: {GOAL_SIZE // KB} kB in <= {GOAL_MS:.0f} ms: {verdict})")


if __name__ == "__main__":
    main()
