"""Achieved FLOP/s of one PPO update, divided by the matmul FLOP/s measured in the same run.

Why: says how much of the CPU's matmul speed the update turns into model work (an MFU-like
ratio), so a slow update can be told apart from a slow machine.

How: one rollout batch (rollout.n_envs slots × --turns lock-steps) is gathered by the real
collector (`make_collector(...).collect`), so prompts, flags and bootstrap prompts are exactly
the collector's. By default the engine is a stand-in that answers every prompt with a canned
THINK/ACTION reply of --response-tokens tokens (no generation cost, fixed response length);
--generate samples with the real engine instead. The batch is scored (`PPOTrainer.score`),
written with `write_turns`, and `trainer.update([path])` is timed after --warmup untimed updates
(the first one allocates the optimizer state; one untimed scoring call pays the other one-off
costs). Scoring (old/ref logprobs, values) is timed separately: update() itself runs no extra
forward.

Side by side, on the same batch in the same run, it then times score + update for the plain
layout against the two cost cuts: the shared prompt prefix run once per micro-batch
(ppo.share_prefix) and LoRA on the top --lora-layers layers only (ppo.lora_layers, so backward
stops there), and prints each one's speed-up. --only-params skips the comparison.

The FLOP figures are of the plain layout (with --only-params: of params.yaml's settings, marked
EFFECTIVE when a cost cut is on, since tokens still count every prompt token).
FLOPs, nominal: 6 × N × tokens for each trained model (actor and critic), tokens = prompt +
response tokens of every row × ppo_epochs (padding not counted), N = parameters that do a matmul
per token: all parameters except embedding tables used only as lookups (a tied LM head counts;
the critic has no LM head, so its embedding does not). With LoRA (ppo.lora) N is still the whole
model, as the nominal figure; the true work is nearer 4 × N × tokens (forward + input gradients;
frozen weights get no weight gradient), printed too. Scoring adds 2 × N × tokens per forward:
old and reference logprobs (actor) and values (critic); the score+update ratio counts them.
Attention-score FLOPs are left out.

The matmul reference is the best of --matmul-repeats n×n×n products in the dtype the update
computes in (bf16 under ppo.bf16), with the same torch threads (default 1: see
bench/prefix_cache.py). --tiny builds a 3M-parameter random model in a temp dir.

    .venv/bin/python bench/ppo_update.py [--turns 4] [--model-dir DIR] [--tiny] [--generate]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from longturn.algo.trainer import PPOTrainer  # noqa: E402
from longturn.config import load_params  # noqa: E402
from longturn.engines.base import Completion, SamplingParams  # noqa: E402
from longturn.engines.registry import make_engine, sampling_from_params  # noqa: E402
from longturn.models import load_tokenizer  # noqa: E402
from longturn.training import gae_params, make_collector, trainer_settings  # noqa: E402
from longturn.trajectories import write_turns  # noqa: E402
from turn_cost import resolve_model_dir  # noqa: E402

FILLER = " The target is not in view yet, so I keep exploring the room step by step."
ACTIONS = ("turn left", "go forward", "turn right", "go forward", "pick up", "toggle")


class CannedEngine:
    """Engine stand-in: every prompt gets a THINK/ACTION reply of exactly `n_tokens` tokens."""

    def __init__(self, tokenizer, n_tokens: int):
        self.tokenizer, self.n_tokens, self.calls = tokenizer, n_tokens, 0

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _reply(self, action: str) -> list[int]:
        head, tail = self._encode("THINK:"), self._encode(f"\nACTION: {action}")
        room = max(0, self.n_tokens - len(head) - len(tail))
        filler = self._encode(FILLER * (1 + room // 8))[:room]
        return head + filler + tail

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        out = []
        for i in range(len(prompt_ids)):
            ids = self._reply(ACTIONS[(self.calls + i) % len(ACTIONS)])
            out.append(Completion(ids, [0.0] * len(ids), "stop"))
        self.calls += 1
        return out

    def update_weights(self, model_dir: str) -> None:
        pass

    def close(self) -> None:
        pass


def collect_batch(params, model_dir: str, tokenizer, args) -> list[dict]:
    """One iteration of turn rows from the collector (canned or real engine)."""
    n_tokens = args.response_tokens or params.engine.sampling.max_new_tokens
    engine = make_engine(model_dir, params) if args.generate else CannedEngine(tokenizer, n_tokens)
    collector = make_collector(params, 0, "bench")
    try:
        return collector.collect(engine, tokenizer, sampling_from_params(params, seed=params.seed),
                                 0, {"run_id": "bench", "policy_version": "base"}, progress=False)
    finally:
        engine.close()


def flop_params(model: torch.nn.Module) -> tuple[int, int]:
    """(all parameters, those that do a matmul per token): embedding tables count only when a
    Linear also uses them (a tied LM head)."""
    params = {id(p): p for p in model.parameters()}
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    linears = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    matmul = sum(p.numel() for k, p in params.items() if k not in lookups or k in linears)
    return sum(p.numel() for p in params.values()), matmul


def matmul_flops(n: int, repeats: int, dtype: torch.dtype) -> float:
    """Best FLOP/s of an n×n by n×n product over `repeats` timed calls (after one warm-up)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def timed_updates(trainer: PPOTrainer, path: str, warmup: int, repeats: int) -> list[float]:
    """Wall seconds of `repeats` updates on the same file, after `warmup` untimed ones."""
    for _ in range(warmup):
        trainer.update([path])
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        trainer.update([path])
        times.append(time.perf_counter() - t0)
    return times


def variants(settings, lora_layers: int) -> dict[str, object]:
    """The settings compared side by side: params.yaml's own, the plain layout (no shared
    prefix, LoRA on every layer), and each cost cut alone and together."""
    out = {"plain": replace(settings, share_prefix=False, lora_layers=None),
           "shared prefix": replace(settings, share_prefix=True, lora_layers=None)}
    if settings.lora:
        out[f"LoRA top {lora_layers} layers"] = replace(settings, share_prefix=False,
                                                       lora_layers=lora_layers)
        out[f"shared prefix + LoRA top {lora_layers}"] = replace(settings, share_prefix=True,
                                                                 lora_layers=lora_layers)
    same = [name for name, s in out.items() if s == settings]
    if same:  # params.yaml is one of the variants: label it, do not time it twice
        out[f"{same[0]} (= params.yaml)"] = out.pop(same[0])
    else:
        out["params.yaml"] = settings
    return out


def measure(settings, model_dir: str, rows: list[dict], params, tokenizer, path: Path,
            args) -> tuple[float, float, PPOTrainer]:
    """(score seconds, median update seconds, trainer) for one setting on a copy of the rows."""
    trainer = PPOTrainer(model_dir, model_dir, settings, gae_params(params), tokenizer)
    if args.warmup:  # first calls pay one-off costs (allocator, kernel selection): not timed
        trainer.score(copy.deepcopy(rows[: settings.mini_batch_size]))
    fresh = copy.deepcopy(rows)
    t0 = time.perf_counter()
    scored = trainer.score(fresh)
    score_seconds = time.perf_counter() - t0
    write_turns(scored, path)
    seconds = statistics.median(timed_updates(trainer, str(path), args.warmup, args.repeats))
    return score_seconds, seconds, trainer


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--model-dir", default=str(ROOT / "data/models/base"))
    ap.add_argument("--turns", type=int, default=None,
                    help="lock-step turns per env slot (default rollout.turns_per_env)")
    ap.add_argument("--response-tokens", type=int, default=None,
                    help="canned reply length (default engine.sampling.max_new_tokens)")
    ap.add_argument("--generate", action="store_true", help="sample replies with the real engine")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed updates (and one untimed scoring) first")
    ap.add_argument("--repeats", type=int, default=1, help="timed updates (median printed)")
    ap.add_argument("--matmul-size", type=int, default=2048)
    ap.add_argument("--matmul-repeats", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="tiny random model in a temp dir")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--lora-layers", type=int, default=8,
                    help="top layers with LoRA in the top-layers variants")
    ap.add_argument("--only-params", action="store_true",
                    help="measure params.yaml's settings only (no side-by-side variants)")
    return ap.parse_args()


def run(args: argparse.Namespace, model_dir: str, tmp: str) -> None:
    params = load_params(args.params)
    if args.turns:
        params.rollout.turns_per_env = args.turns
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(model_dir)
    rows = collect_batch(params, model_dir, tokenizer, args)
    settings = trainer_settings(params)
    dtype = torch.bfloat16 if settings.bf16 else torch.float32
    peak = matmul_flops(args.matmul_size, args.matmul_repeats, dtype)
    timings = {}
    for name, setting in variants(settings, args.lora_layers).items():
        if args.only_params and "params.yaml" not in name:
            continue
        score_s, update_s, trainer = measure(setting, model_dir, rows, params, tokenizer,
                                             Path(tmp) / f"{len(timings)}.parquet", args)
        timings[name] = (score_s, update_s)
        if ("params.yaml" in name) if args.only_params else name.startswith("plain"):
            models = {"actor": flop_params(trainer.actor_module),
                      "critic": flop_params(trainer.critic_module)}
            report(args, params, rows, name, setting, models, (score_s, update_s), peak, dtype)
        del trainer
    print_side_by_side(timings, rows)


def print_side_by_side(timings: dict[str, tuple[float, float]], rows: list[dict]) -> None:
    """Score + update seconds per setting, and each one's speed-up over the plain layout."""
    if "plain" not in timings:
        return
    base = sum(timings["plain"])
    tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)
    print("\nside by side (same batch, same run): score + update, speed-up vs plain")
    for name, (score_s, update_s) in timings.items():
        total = score_s + update_s
        print(f"  {name:44s} score {score_s:7.1f} s  update {update_s:7.1f} s  "
              f"total {total:7.1f} s  {tokens / total:6.0f} tokens/s  x{base / total:5.2f}")


def report(args, params, rows, name, setting, models, seconds, peak, dtype) -> None:
    """FLOP/s of one variant against the matmul peak. Tokens count every prompt token, so with a
    shared prefix or top-layer LoRA the figure is effective (the plain layout's work per second)."""
    score_s, update_s = seconds
    (_, n_actor), (_, n_critic) = models["actor"], models["critic"]
    tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)
    update = 6 * (n_actor + n_critic) * tokens * setting.ppo_epochs
    lora_update = 4 * (n_actor + n_critic) * tokens * setting.ppo_epochs
    forwards = 2 * (2 * n_actor + n_critic) * tokens  # old + ref logprobs, values
    prompt = statistics.mean(len(r["prompt_ids"]) for r in rows)
    response = statistics.mean(len(r["response_ids"]) for r in rows)
    effective = setting.share_prefix or setting.lora_layers
    print(f"PPO update ({name}): {len(rows)} turns ({params.rollout.n_envs} envs x "
          f"{params.rollout.turns_per_env}), prompt {prompt:.0f} + response {response:.0f} "
          f"tokens/turn, {'sampled' if args.generate else 'canned'} replies; ppo_epochs="
          f"{setting.ppo_epochs} mini={setting.mini_batch_size} micro={setting.micro_batch_size} "
          f"lora={setting.lora} lora_layers={setting.lora_layers} "
          f"share_prefix={setting.share_prefix} bf16={setting.bf16}, "
          f"torch threads={torch.get_num_threads()}")
    for model, (total, matmul) in models.items():
        print(f"  {model:6s} params        : {total / 1e6:8.2f} M, {matmul / 1e6:8.2f} M doing "
              "matmuls (N)")
    print(f"  score / update s     : {score_s:10.2f} / {update_s:.2f}")
    print(f"  tokens               : {tokens:10d}   ({tokens * setting.ppo_epochs / update_s:.0f} "
          "tokens/s in the update)")
    print(f"  matmul GFLOP/s       : {peak / 1e9:10.2f}   ({args.matmul_size}^3 "
          f"{str(dtype).removeprefix('torch.')}, best of {args.matmul_repeats})")
    print(f"  update GFLOP/s       : {update / update_s / 1e9:10.2f}   (6 x N x tokens, actor + "
          f"critic){'  EFFECTIVE' if effective else ''}")
    print(f"  ratio (MFU-like)     : {update / update_s / peak:10.3f}")
    if setting.lora:
        print(f"  LoRA-adjusted ratio  : {lora_update / update_s / peak:10.3f}   (4 x N x tokens: "
              "frozen weights get no weight gradient)")
    total = update + forwards
    print(f"  score+update ratio   : {total / (score_s + update_s) / peak:10.3f}   (plus the "
          "scoring forwards: 2 x N x tokens for old logprobs, ref logprobs, values)")


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(args, resolve_model_dir(args, tmp), tmp)


if __name__ == "__main__":
    main()
