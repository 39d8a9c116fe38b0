"""Rollout cost per turn early (turn 10) vs late (turn 400) in ONE long BabyAI episode.

Why: the prompt carries only the history window (prompt.history_turns) plus the current
observation, so a turn deep into an episode must cost what an early one costs. One slot plays
one episode turn by turn as the train rollout does (a conversation of the env, each reply given
the action prompt: `ConversationRun.of_env`, one lock-step a turn); the env's step limit is
raised above the last turn measured (env.max_turns is ignored). Printed: mean wall time, prompt
tokens and response tokens per turn over turns 5-15 and 395-405 (window half-width --half), and
the late/early ratios (≈ 1).

--fast-forward: only the two windows (and the turns before the first) use the real engine. The
turns in between are driven by a stand-in that costs no model call but still pushes realistic
history through the agent: each turn renders the real prompt and feeds a canned THINK/ACTION reply
(the token ids of a typical answer, cycling through the actions) to the env, so the env moves
and the history window fills exactly as in a real rollout. Without it every turn runs the
model (400 real turns: slow with the 135M model on CPU).

If the episode ends before the late window (the goal reached), it is replayed with the next seed.
Torch uses every core this process may run on unless --threads says otherwise.
--tiny runs the tiny random model (bench/tiny_model.py) over turns 2-6 and 14-18, 8 new tokens per
turn: a smoke run in seconds, not a measurement.

--conversation: the same question for a tool-using conversation (issue 22), reply 10 vs reply 100
(--replies; --tiny 3 and 12) of ONE long arithmetic episode of calculator calls, with the whole
episode as context (verl / slime) and with a history window (profile calculator_window), side by
side. The episode is played once through the real rollout with canned replies (the ids of a
typical calculator call: no model runs while playing), so its messages, tool results and windows
are the rollout's own; what is timed is the actor's forward over each reply's sample (the scoring
pass): what the reply was given and the reply, the whole sequence before it or its window.
Printed: prompt tokens and the median time of --repeats forwards per reply and context, and the
ratios; then what tokenizing the late reply's window costs through the prompt token cache
(agent/token_cache.py, as the rollout does) and with the tokenizer on the whole text.

    .venv/bin/python bench/turn_cost.py [--fast-forward] [--turns 400] [--model-dir DIR]
        [--tiny [--tiny-dir DIR]]
    .venv/bin/python bench/turn_cost.py --conversation [--replies 10 100] [--tiny]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from longturn.params.config import load_params, parse_params  # noqa: E402
from longturn.params.profiles import resolve_profile  # noqa: E402
from longturn.engines.base import Completion  # noqa: E402
from longturn.engines.logprobs import (pack_prompt_response, response_logits,  # noqa: E402
                                       token_logprobs)
from longturn.agent.token_cache import PieceTokenizer  # noqa: E402
from longturn.rollout.chat_deltas import ChatDeltas  # noqa: E402
from longturn.rollout.conversation_rollout import chat_deltas, conversation_rollout  # noqa: E402
from longturn.rollout.history_window import window_messages  # noqa: E402
from longturn.rollout.conversation_setup import ConversationRun  # noqa: E402
from longturn.engines.registry import make_engine, sampling_from_params  # noqa: E402
from longturn.rollout.collection import EpisodeStart  # noqa: E402
from longturn.rollout.conversation_player import ConversationPlayer  # noqa: E402
from longturn.run.models import load_tokenizer  # noqa: E402
from cpu_threads import add_threads_arg, use_threads  # noqa: E402
from tiny_model import add_tiny_args, fill_defaults, resolve_model_dir  # noqa: E402

FULL = {"turns": 400, "early": 10, "half": 5, "new_tokens": None, "replies": [10, 100],
        "repeats": 3}
TINY = {"turns": 16, "early": 4, "half": 2, "new_tokens": 8, "replies": [3, 12], "repeats": 3}
WINDOW_PROFILE = ROOT / "configs" / "profiles" / "calculator_window.yaml"
CANNED_CALL = ("I work the numbers out step by step with the calculator.\n<tool_call>\n"
               '{{"name": "calculator", "arguments": {{"expression": "{} * 7 + 3"}}}}\n'
               "</tool_call>")
CANNED = ("THINK: I do not see my target yet, so I look around and keep exploring.\n"
          "ACTION: {}")
CANNED_ACTIONS = ("turn left", "go forward", "turn right", "go forward")


class TurnEngine:
    """The engine of one turn: the model, or (`canned`) a typical reply at once; says what the
    turn's prompt and reply were (`last`: their token counts)."""

    def __init__(self, engine, tokenizer):
        self.engine, self.tokenizer, self.canned, self.turn = engine, tokenizer, False, 0
        self.last = (0, 0)

    def generate(self, prompt_ids, sampling, images=None):
        if self.canned:
            text = CANNED.format(CANNED_ACTIONS[self.turn % len(CANNED_ACTIONS)])
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out = [Completion(ids, [0.0] * len(ids), "stop")]
        else:
            out = self.engine.generate(prompt_ids, sampling)
        self.last = (len(prompt_ids[0]), len(out[0].token_ids))
        return out


def play_episode(engine: TurnEngine, tokenizer, player: ConversationPlayer, sampling, windows,
                 last: int, fast_forward: bool) -> dict[int, tuple[float, int, int]] | None:
    """Turns 0..last of the player's one episode, one lock-step each; {turn: (seconds, prompt
    tokens, response tokens)} for the turns that ran the real engine, or None if the episode
    ended early."""
    measured = {}
    for turn in range(last + 1):
        engine.turn = turn
        engine.canned = fast_forward and windows[0][1] < turn < windows[1][0]
        t0 = time.perf_counter()
        _, ended = player.lock_step(engine, tokenizer, sampling, 0, turn, False)
        if not engine.canned:
            measured[turn] = (time.perf_counter() - t0, *engine.last)
        if ended and turn < last:
            return None
    return measured


def window_means(measured: dict[int, tuple[float, int, int]], lo: int, hi: int) -> tuple:
    """Mean seconds, prompt tokens and response tokens over turns lo..hi."""
    rows = [measured[t] for t in range(lo, hi + 1)]
    return tuple(statistics.mean(r[i] for r in rows) for i in range(3))


class CannedCalls:
    """Stands in for the engine while the conversation is played: every reply is a typical
    calculator call (its token ids and the end-of-turn token), so the episode runs as long as
    asked and each tool result is the calculator's own."""

    def __init__(self, tokenizer):
        self.tokenizer, self.replies = tokenizer, 0
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompt_ids, sampling, images=None):
        out = []
        for _ in prompt_ids:
            self.replies += 1
            ids = self.tokenizer.encode(CANNED_CALL.format(10 + self.replies),
                                        add_special_tokens=False) + [self.end]
            out.append(Completion(ids, [0.0] * len(ids), "stop"))
        return out


def long_tool_episode(tokenizer, replies: int, max_tokens: int
                      ) -> tuple[dict, int, ChatDeltas, int]:
    """One arithmetic episode of `replies` calculator calls, played by the rollout with the
    calculator_window profile's settings (its record keeps the whole sequence and each reply's
    window); the window's turns, the template deltas the rollout rendered with, and how many
    of the episode's messages the task gave (its head)."""
    profile = resolve_profile(WINDOW_PROFILE)
    chat = profile["rollout"]["chat"]
    chat.update(tools=str(ROOT / chat["tools"]), interactions=None,
                interaction=None)  # every reply is a call: no user turn
    params = parse_params(profile, str(WINDOW_PROFILE))
    run = ConversationRun.from_params(params, progress=False)
    settings = dataclasses.replace(run.settings, max_assistant_turns=replies,
                                   max_tokens=max_tokens, tokenization_check="off")
    sampling = sampling_from_params(params, seed=0)
    task = run.record("arithmetic", 0)
    [record] = conversation_rollout(CannedCalls(tokenizer), tokenizer, sampling, [task], settings)
    if len(record["segment_starts"]) < replies:
        sys.exit(f"the episode ended after {len(record['segment_starts'])} replies "
                 f"({record['termination']}): raise the model's context or lower --replies")
    deltas = chat_deltas(CannedCalls(tokenizer), tokenizer, settings)
    return record, settings.history_turns, deltas, len(deltas.prepare(task["messages"]))


def window_tokenize_ms(deltas: ChatDeltas, messages: list[dict], head: int, turns: int, k: int,
                       repeats: int) -> tuple[int, float, float]:
    """Reply k's window (the task's `head` messages and the last `turns` turns before it): its
    tokens, and the median ms of tokenizing its text through a piece cache that tokenized the
    episode's earlier windows first, as the rollout's does (only the newest turns' pieces are
    new), and with the tokenizer on the whole text. The cache is past its first calls' check
    against whole-text ids, as in a run after its first 32 prompts."""
    replies = [i for i in range(head, len(messages)) if messages[i]["role"] == "assistant"]
    texts = []
    for j in range(k + 1):
        before = messages[:replies[j]]
        texts.append(deltas.render([before[i] for i in window_messages(before, head, turns)],
                                   add_generation_prompt=True))
    cached, whole = [], []
    for _ in range(repeats):
        pieces = PieceTokenizer(deltas.tokenizer)
        pieces.verify_left = 0
        for text in texts[:-1]:
            pieces(text)
        t0 = time.perf_counter()
        ids = pieces(texts[-1])
        cached.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        reference = deltas.tokenizer.encode(texts[-1], add_special_tokens=False)
        whole.append(time.perf_counter() - t0)
        assert reference == ids
    return len(ids), statistics.median(cached) * 1e3, statistics.median(whole) * 1e3


def forward_ms(model, samples: list[tuple[list[int], list[int]]], pad: int,
               repeats: int) -> list[float]:
    """Median wall time (ms) of the actor's no-grad forward scoring each (prompt, response),
    the samples taken in turn round after round, so a load that comes and goes hits them alike;
    a first round warms up."""
    batches = [pack_prompt_response([prompt], [response], pad) for prompt, response in samples]
    times: list[list[float]] = [[] for _ in batches]
    with torch.no_grad():
        for _ in range(repeats + 1):
            for batch, kept in zip(batches, times):
                t0 = time.perf_counter()
                token_logprobs(response_logits(model, batch), batch.response_ids)
                kept.append(time.perf_counter() - t0)
    return [statistics.median(kept[1:]) * 1e3 for kept in times]


def run_conversation(args: argparse.Namespace, model_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    use_threads(args.threads)
    early, late = args.replies
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    context = int(model.config.max_position_embeddings)
    t0 = time.perf_counter()
    record, turns, deltas, head = long_tool_episode(tokenizer, late + 1, context)
    ids, starts, ends = record["input_ids"], record["segment_starts"], record["segment_ends"]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    samples = []  # per reply: the whole sequence before it, then its window; and the reply
    for k in (early, late):
        reply = ids[starts[k]:ends[k]]
        samples += [(ids[:starts[k]], reply), (record["window_prompts"][k], reply)]
    ms = forward_ms(model, samples, pad, args.repeats)
    rows = {k: (len(samples[2 * i][0]), ms[2 * i], len(samples[2 * i + 1][0]), ms[2 * i + 1])
            for i, k in enumerate((early, late))}
    print(f"one arithmetic episode of {late + 1} calculator calls (canned replies through the "
          f"rollout), {len(ids)} tokens in all; the actor's forward over a reply's sample, median "
          f"of {args.repeats}; window of history_turns={turns}; torch threads="
          f"{torch.get_num_threads()}, {time.perf_counter() - t0:.1f} s in all")
    for k, (p_whole, t_whole, p_window, t_window) in rows.items():
        print(f"  reply {k:3d}: whole episode prompt {p_whole:6d} tok {t_whole:8.1f} ms   "
              f"window prompt {p_window:6d} tok {t_window:8.1f} ms")
    (pe, te, we, ue), (pl, tl, wl, ul) = rows[early], rows[late]
    print(f"  ratio reply {late} / reply {early}: whole episode time {tl / te:.2f}x prompt "
          f"{pl / pe:.2f}x   window time {ul / ue:.2f}x prompt {wl / we:.2f}x")
    print(f"  ratio whole episode / window at reply {late}: time {tl / ul:.2f}x prompt "
          f"{pl / wl:.2f}x")
    tokens, cached, whole = window_tokenize_ms(deltas, json.loads(record["messages"]), head,
                                               turns, late, 20 * args.repeats)
    if tokens != len(record["window_prompts"][late]):
        sys.exit(f"reply {late}'s window rendered here has {tokens} tokens, the rollout's "
                 f"{len(record['window_prompts'][late])}: the bench no longer renders it the "
                 "rollout's way")
    print(f"  reply {late}'s window ({tokens} tok) tokenized: piece cache {cached:.3f} ms, "
          f"whole text {whole:.3f} ms; ratio whole text / piece cache {whole / cached:.2f}x")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--model-dir", default=str(ROOT / "data/models/base"))
    ap.add_argument("--turns", type=int, default=None,
                    help=f"centre of the late window ({FULL['turns']}; --tiny {TINY['turns']})")
    ap.add_argument("--early", type=int, default=None,
                    help=f"centre of the early window ({FULL['early']}; --tiny {TINY['early']})")
    ap.add_argument("--half", type=int, default=None,
                    help=f"window half-width in turns ({FULL['half']}; --tiny {TINY['half']})")
    ap.add_argument("--new-tokens", type=int, default=None,
                    help="max new tokens per turn (engine.sampling.max_new_tokens; --tiny "
                         f"{TINY['new_tokens']})")
    ap.add_argument("--task", default="goto")
    ap.add_argument("--seed", type=int, default=0, help="first env reset seed tried")
    ap.add_argument("--fast-forward", action="store_true",
                    help="canned replies between the windows instead of the model")
    ap.add_argument("--conversation", action="store_true",
                    help="a long calculator conversation instead: reply --replies, whole "
                         "episode vs history window")
    ap.add_argument("--replies", type=int, nargs=2, default=None, metavar=("EARLY", "LATE"),
                    help=f"with --conversation: the two replies compared ({FULL['replies']}; "
                         f"--tiny {TINY['replies']})")
    ap.add_argument("--repeats", type=int, default=None,
                    help=f"with --conversation: forwards timed per reply ({FULL['repeats']}; "
                         f"--tiny {TINY['repeats']})")
    add_tiny_args(ap)
    add_threads_arg(ap)
    return fill_defaults(ap.parse_args(), FULL, TINY)


def run(args: argparse.Namespace, model_dir: str) -> None:
    params = load_params(args.params)
    windows = [(args.early - args.half, args.early + args.half),
               (args.turns - args.half, args.turns + args.half)]
    last = windows[1][1]
    env = params.env.model_copy(update={
        "tasks": [args.task], "max_turns": None, "workers": False, "step_timeout_s": None,
        "kwargs": {**params.env.kwargs, "max_steps": last + 10}})
    params = params.model_copy(update={"env": env})
    params.engine.batch_size = 1
    if args.new_tokens:
        params.engine.sampling.max_new_tokens = args.new_tokens
    use_threads(args.threads)
    tokenizer = load_tokenizer(model_dir)
    engine = TurnEngine(make_engine(model_dir, params), tokenizer)
    player = ConversationPlayer(ConversationRun.of_env(params, progress=False), 1,
                                fixed_turns=True)
    sampling = sampling_from_params(params, seed=params.seed)
    t0 = time.perf_counter()
    try:
        for seed in range(args.seed, args.seed + 5):
            player.close()
            player.start([EpisodeStart(0, args.task, seed, f"turn-cost-{seed}")])
            measured = play_episode(engine, tokenizer, player, sampling, windows, last,
                                    args.fast_forward)
            if measured is not None:
                break
            print(f"  episode with seed {seed} ended before turn {last}: next seed")
        else:
            sys.exit("five episodes in a row ended early: try another --seed or --task")
    finally:
        player.close()
        engine.engine.close()
    report(args, params, windows, measured, seed, time.perf_counter() - t0)


def report(args, params, windows, measured, seed, total) -> None:
    mode = "fast-forward (canned replies between windows)" if args.fast_forward else "all real"
    print(f"one {args.task!r} episode (seed {seed}), {windows[1][1] + 1} turns, {mode}; "
          f"{params.engine.name} engine, {params.model.dtype}, history_turns="
          f"{params.prompt.history_turns}, torch threads={torch.get_num_threads()}, "
          f"{total:.1f} s in all")
    stats = []
    for lo, hi in windows:
        secs, prompt, response = window_means(measured, lo, hi)
        stats.append((secs, prompt, response))
        print(f"  turns {lo:3d}-{hi:3d}: {secs * 1e3:8.1f} ms/turn   prompt {prompt:6.1f} tok   "
              f"response {response:5.1f} tok")
    (s0, p0, r0), (s1, p1, r1) = stats
    print(f"  ratio late / early: time {s1 / s0:.2f}x   prompt tokens {p1 / p0:.2f}x   "
          f"response tokens {r1 / r0:.2f}x")


def main() -> None:
    args = parse_args()
    if args.conversation:
        if not 0 <= args.replies[0] < args.replies[1] or args.repeats < 1:
            sys.exit("need 0 <= EARLY < LATE for --replies, and --repeats >= 1")
        with tempfile.TemporaryDirectory() as tmp:
            run_conversation(args, resolve_model_dir(args, tmp))
        return
    if not 0 <= args.early - args.half <= args.early + args.half < args.turns - args.half:
        sys.exit("need 0 <= early - half and early + half < turns - half")
    with tempfile.TemporaryDirectory() as tmp:
        run(args, resolve_model_dir(args, tmp))


if __name__ == "__main__":
    main()
