"""What one fixed-turn batch of conversations costs the rollout early in long episodes vs late.

Why: Verlog's turn-level method promises a flat cost per turn however long episodes run, and a
fixed-turn batch hands on a running episode's replies so far as a part of its record. If a part
(or the window of the next reply) were built from the whole episode, batch k would cost O(k) and
an episode of 10,000 replies O(k²) in all. Here n_envs calculator episodes with a history window
(profile calculator_window; every reply a tool call, so no episode ends) are played batch after
batch by the real collector with canned replies (bench/turn_cost.py `CannedCalls`: no model runs),
so what is timed is the rollout itself: windows rendered, tools called, records cut, samples
built. Printed: the median ms per batch over the first and the last --window batches, their
ratio (≈ 1 when flat), what a running episode still keeps at the end, and the memory the
rollout keeps per reply (traced in a second, untimed pass).

    .venv/bin/python bench/conversation_batches.py [--replies 1000] [--n-envs 4]
        [--turns-per-env 8] [--tiny [--tiny-dir DIR]]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from longturn.engines.registry import sampling_from_params  # noqa: E402
from longturn.params.config import parse_params  # noqa: E402
from longturn.params.profiles import resolve_profile  # noqa: E402
from longturn.rollout.conversation_player import conversation_fixed_turns  # noqa: E402
from longturn.rollout.conversation_setup import ConversationRun  # noqa: E402
from longturn.run.models import load_tokenizer  # noqa: E402
from tiny_model import add_tiny_args, fill_defaults, resolve_model_dir  # noqa: E402
from turn_cost import WINDOW_PROFILE, CannedCalls  # noqa: E402

FULL = {"replies": 1000, "window": 5}
TINY = {"replies": 48, "window": 2}


def collector(n_envs: int, turns_per_env: int):
    """Fixed-turn batches of calculator episodes that never end (no interaction, every reply a
    call, no turn limit), with the calculator_window profile's window and budget."""
    profile = resolve_profile(WINDOW_PROFILE)
    chat = profile["rollout"]["chat"]
    chat.update(tools=str(ROOT / chat["tools"]), interactions=None, interaction=None)
    params = parse_params(profile, str(WINDOW_PROFILE))
    run = ConversationRun.from_params(params, progress=False)
    run.settings = dataclasses.replace(run.settings, max_assistant_turns=10**9)
    return (conversation_fixed_turns(run, ["arithmetic"], n_envs, turns_per_env, seed=0),
            sampling_from_params(params, seed=0), params.history_window)


def kept_per_reply(tokenizer, n_envs: int, turns_per_env: int, batches: int) -> float:
    """Bytes the rollout keeps per reply of a running episode: traced memory (tracemalloc, a
    pass of its own, untimed) over the second half of `batches`, per reply and slot. Its canned
    replies are the timed pass's again, so the prompt token cache (bounded) does not grow."""
    batch, sampling, _ = collector(n_envs, turns_per_env)
    engine = CannedCalls(tokenizer)
    tracemalloc.start()
    try:
        for iteration in range(batches):
            if iteration == batches // 2:
                before = tracemalloc.get_traced_memory()[0]
            batch.collect(engine, tokenizer, sampling, iteration, progress=False)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        batch.close()
    return grown / ((batches - batches // 2) * turns_per_env * n_envs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replies", type=int, default=None,
                    help=f"replies per episode by the last batch ({FULL['replies']}; --tiny "
                         f"{TINY['replies']})")
    ap.add_argument("--n-envs", type=int, default=4)
    ap.add_argument("--turns-per-env", type=int, default=8)
    ap.add_argument("--window", type=int, default=None,
                    help=f"batches timed at each end ({FULL['window']}; --tiny {TINY['window']})")
    ap.add_argument("--model-dir", default=str(ROOT / "data/models/base"),
                    help="whose tokenizer renders the episodes (no model runs)")
    add_tiny_args(ap)
    args = fill_defaults(ap.parse_args(), FULL, TINY)
    window = args.window
    batches = max(2 * window, args.replies // args.turns_per_env)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = load_tokenizer(resolve_model_dir(args, tmp))
    batch, sampling, turns = collector(args.n_envs, args.turns_per_env)
    engine = CannedCalls(tokenizer)
    seconds = []
    t_all = time.perf_counter()
    try:
        batch.collect(engine, tokenizer, sampling, -1, progress=False)  # warm-up, not timed
        for iteration in range(batches):
            t0 = time.perf_counter()
            samples = batch.collect(engine, tokenizer, sampling, iteration, progress=False)
            seconds.append(time.perf_counter() - t0)
            assert len(samples) == args.n_envs * args.turns_per_env
        episode = batch.player.episodes[0]
        kept_windows = sum(w is not None for w in episode.windows)
        kept_ids, made = len(episode.ids), len(episode.segments)
    finally:
        batch.close()
    kept = kept_per_reply(tokenizer, args.n_envs, args.turns_per_env, batches)
    early = statistics.median(seconds[:window]) * 1e3
    late = statistics.median(seconds[-window:]) * 1e3
    print(f"{args.n_envs} calculator episodes, window of history_turns={turns}, "
          f"{args.turns_per_env} replies a slot per batch, {batches} batches "
          f"({time.perf_counter() - t_all:.1f} s in all), canned replies")
    print(f"  batches 1-{window} (replies 1-{window * args.turns_per_env}): {early:.1f} ms/batch")
    print(f"  batches {batches - window + 1}-{batches} (replies up to {made}): "
          f"{late:.1f} ms/batch")
    print(f"  ratio late / early: {late / early:.2f}x")
    print(f"  a running episode at reply {made} keeps {kept_windows} reply windows and "
          f"{kept_ids} token ids ({kept_ids / made:.0f} per reply: the sequence the end-of-episode "
          "tokenization check reads)")
    print(f"  memory kept per reply of a running episode: {kept:.0f} bytes (traced over the "
          "second half of a second pass)")


if __name__ == "__main__":
    main()
