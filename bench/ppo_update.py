"""Achieved FLOP/s of one PPO update, divided by the matmul FLOP/s measured in the same run.

Why: says how much of the CPU's matmul speed the update turns into model work (an MFU-like
ratio), so a slow update can be told apart from a slow machine; and, side by side, what each of
the trainer's cost cuts buys on the same batch.

How: one rollout batch (rollout.n_envs slots × --turns lock-steps) is gathered by the real
collector (`make_collector(...).collect`), so prompts, flags and bootstrap prompts are exactly
the collector's. By default the engine is a stand-in that answers every prompt with a canned
THINK/ACTION reply of --response-tokens tokens (no generation cost, fixed response length);
--generate samples with the real engine instead. The batch (the collector's samples) is scored
(`PPOTrainer.score`), written with `write_samples`, and `trainer.update([path])` is timed after
--warmup untimed updates (the first one allocates the optimizer state; one untimed scoring call
on a copy of the whole batch pays the other one-off costs: a slice of it could cut an episode,
which scoring refuses).
Scoring (old/ref logprobs, values) is timed separately: update() itself runs no extra forward.

Side by side, on the same batch in the same run, it then times score + update for the plain
layout (no shared prefix, LoRA on every layer, no shared trunk) against the cost cuts: the shared
prompt prefix run once per micro-batch (ppo.share_prefix), LoRA on the top --lora-layers layers
only (ppo.lora_layers, so backward stops there), both, and each LoRA variant with the shared
trunk off and on (ppo.share_trunk: the frozen layers below the adapters run once for actor,
reference and critic; it only matters with LoRA on the top layers). Each line prints the trunk
depth the trainer chose (`trainer.models.depth` of the model's layers) and its speed-up over
plain; the trunk on/off speed-ups are printed after. With ppo.lora false (full fine-tuning) the
LoRA and trunk variants are skipped. --only-params skips the comparison.

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
computes in (bf16 under ppo.bf16), with the same torch threads (default: every core this
process may run on; --threads N).

--tiny runs the tiny random model (bench/tiny_model.py) on 2 envs × 2 turns, 8-token replies,
mini- and micro-batch 2 (smaller than the batch, as in the default run), LoRA on the top 1 of its
2 layers, fp32, no warm-up update: a smoke run in seconds whose ratios mean little (a 3M-parameter
model is all overhead).

    .venv/bin/python bench/ppo_update.py [--turns 4] [--model-dir DIR] [--generate]
        [--tiny [--tiny-dir DIR]]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from longturn.algo.trainer import PPOTrainer, TrainerSettings  # noqa: E402
from longturn.params.config import load_params  # noqa: E402
from longturn.engines.base import Completion, SamplingParams  # noqa: E402
from longturn.engines.registry import make_engine, sampling_from_params  # noqa: E402
from longturn.run.models import load_tokenizer  # noqa: E402
from longturn.run.wiring import (gae_params, make_collector,  # noqa: E402
                                 trainer_settings)
from longturn.trajectories import write_samples  # noqa: E402
from cpu_threads import add_threads_arg, use_threads  # noqa: E402
from tiny_model import add_tiny_args, fill_defaults, resolve_model_dir  # noqa: E402

FULL = {"envs": None, "turns": None, "response_tokens": None, "mini_batch": None,
        "micro_batch": None, "matmul_size": 2048, "matmul_repeats": 3, "lora_layers": 8,
        "warmup": 1, "bf16": None}
# mini-batch 2 < the batch's 4 turns: a warm-up that scored only the first mini-batch would cut
# both episodes, so the smoke run also guards the warm-up
TINY = {"envs": 2, "turns": 2, "response_tokens": 8, "mini_batch": 2, "micro_batch": 2,
        "matmul_size": 256, "matmul_repeats": 2, "lora_layers": 1, "warmup": 0, "bf16": False}
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
    """One iteration of samples from the collector (canned or real engine)."""
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


@dataclass(frozen=True)
class Timing:
    """One variant's measurement on the shared batch."""

    score_s: float
    update_s: float  # median of the timed updates
    depth: int  # layers the trainer shares between actor, reference and critic

    @property
    def total_s(self) -> float:
        return self.score_s + self.update_s


def effective(settings: TrainerSettings, layers: int) -> TrainerSettings:
    """The same computation, written one way: LoRA on at least every layer is LoRA on all of
    them, and the trunk switch does nothing unless LoRA leaves bottom layers frozen."""
    lora_layers = settings.lora_layers
    if not settings.lora or (lora_layers is not None and lora_layers >= layers):
        lora_layers = None
    trunk = settings.share_trunk and settings.lora and lora_layers is not None
    return replace(settings, lora_layers=lora_layers, share_trunk=trunk)


def variants(settings: TrainerSettings, lora_layers: int,
             layers: int) -> dict[str, TrainerSettings]:
    """The settings compared side by side: the plain layout (no shared prefix, LoRA on every
    layer, no shared trunk), each cost cut, and each LoRA-top variant with the trunk off and on;
    params.yaml's own settings are labelled where they run the same computation as one, else
    added."""
    plain = replace(settings, share_prefix=False, lora_layers=None, share_trunk=False)
    out = {"plain": plain, "shared prefix": replace(plain, share_prefix=True)}
    if settings.lora:
        top = f"LoRA top {lora_layers}"
        for prefix_name, share_prefix in (("", False), ("shared prefix + ", True)):
            for trunk in (False, True):
                out[f"{prefix_name}{top}, trunk {'on' if trunk else 'off'}"] = replace(
                    plain, share_prefix=share_prefix, lora_layers=lora_layers, share_trunk=trunk)
    same = [name for name, s in out.items() if effective(s, layers) == effective(settings, layers)]
    if same:  # params.yaml is one of the variants: label it, do not time it twice
        out[f"{same[0]} (= params.yaml)"] = out.pop(same[0])
    else:
        out["params.yaml"] = settings
    return out


def trunk_pairs(names: list[str]) -> list[tuple[str, str, str]]:
    """(label, trunk-off name, trunk-on name) for every LoRA variant timed both ways."""
    pairs = []
    for off in names:
        if ", trunk off" not in off:
            continue
        label = off.split(", trunk off")[0]
        on = next((n for n in names if n.startswith(f"{label}, trunk on")), None)
        if on is not None:
            pairs.append((label, off, on))
    return pairs


def model_layers(model_dir: str) -> int:
    """Transformer layers of the model (from its config.json)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    config = config.get("text_config", config)
    return int(config["num_hidden_layers"])


def measure(settings: TrainerSettings, model_dir: str, samples: list[dict], params, tokenizer,
            path: Path, args) -> tuple[Timing, PPOTrainer]:
    """Score + update timing for one setting on a copy of the samples, and the trainer."""
    trainer = PPOTrainer(model_dir, model_dir, settings, gae_params(params), tokenizer)
    # first calls pay one-off costs (allocator, kernel selection): not timed. The whole batch,
    # as a slice of it can cut an episode (no next turn, no bootstrap prompt: scoring refuses)
    trainer.score(copy.deepcopy(samples))
    fresh = copy.deepcopy(samples)
    t0 = time.perf_counter()
    scored = trainer.score(fresh)
    score_seconds = time.perf_counter() - t0
    write_samples(scored, path)
    seconds = statistics.median(timed_updates(trainer, str(path), args.warmup, args.repeats))
    return Timing(score_seconds, seconds, trainer.models.depth), trainer


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--model-dir", default=str(ROOT / "data/models/base"))
    ap.add_argument("--envs", type=int, default=None,
                    help="env slots (default rollout.n_envs; --tiny 2)")
    ap.add_argument("--turns", type=int, default=None,
                    help="lock-step turns per env slot (default rollout.turns_per_env; --tiny 2)")
    ap.add_argument("--response-tokens", type=int, default=None,
                    help="canned reply length (default engine.sampling.max_new_tokens; --tiny 8)")
    ap.add_argument("--mini-batch", type=int, default=None,
                    help="turns per optimizer step (default ppo.mini_batch_size; --tiny 2)")
    ap.add_argument("--micro-batch", type=int, default=None,
                    help="turns per forward/backward (default ppo.micro_batch_size; --tiny 2)")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bf16 autocast (default ppo.bf16; --tiny off: CPU bf16 kernels are slow "
                         "at tiny sizes)")
    ap.add_argument("--generate", action="store_true", help="sample replies with the real engine")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed updates first (default 1; --tiny 0); one untimed scoring "
                         "always runs first")
    ap.add_argument("--repeats", type=int, default=1, help="timed updates (median printed)")
    ap.add_argument("--matmul-size", type=int, default=None, help="default 2048 (--tiny 256)")
    ap.add_argument("--matmul-repeats", type=int, default=None, help="default 3 (--tiny 2)")
    add_threads_arg(ap)
    ap.add_argument("--lora-layers", type=int, default=None,
                    help="top layers with LoRA in the top-layers variants (default 8; --tiny 1)")
    ap.add_argument("--only-params", action="store_true",
                    help="measure params.yaml's settings only (no side-by-side variants)")
    add_tiny_args(ap)
    args = fill_defaults(ap.parse_args(), FULL, TINY)
    if args.repeats < 1 or args.lora_layers < 1 or args.warmup < 0:
        ap.error("--repeats and --lora-layers must be >= 1, --warmup >= 0")
    return args


def settings_from(params, args) -> TrainerSettings:
    """params.yaml's trainer settings with the command line's batch sizes and bf16."""
    settings = trainer_settings(params)
    sizes = {"mini_batch_size": args.mini_batch or settings.mini_batch_size,
             "micro_batch_size": args.micro_batch or settings.micro_batch_size,
             "bf16": settings.bf16 if args.bf16 is None else args.bf16}
    try:
        return replace(settings, **sizes)
    except ValueError as err:
        sys.exit(f"--mini-batch / --micro-batch: {err}")


def run(args: argparse.Namespace, model_dir: str, tmp: str) -> None:
    params = load_params(args.params)
    if args.envs:
        params.rollout.n_envs = args.envs
    if args.turns:
        params.rollout.turns_per_env = args.turns
    use_threads(args.threads)
    tokenizer = load_tokenizer(model_dir)
    samples = collect_batch(params, model_dir, tokenizer, args)
    settings = settings_from(params, args)
    layers = model_layers(model_dir)
    if settings.lora and args.lora_layers >= layers:
        print(f"note: --lora-layers {args.lora_layers} >= the model's {layers} layers: LoRA "
              "covers every layer, so the top-layer and trunk variants equal plain")
    dtype = torch.bfloat16 if settings.bf16 else torch.float32
    peak = matmul_flops(args.matmul_size, args.matmul_repeats, dtype)
    timings: dict[str, Timing] = {}
    for name, setting in variants(settings, args.lora_layers, layers).items():
        if args.only_params and "params.yaml" not in name:
            continue
        timing, trainer = measure(setting, model_dir, samples, params, tokenizer,
                                  Path(tmp) / f"{len(timings)}.parquet", args)
        timings[name] = timing
        if ("params.yaml" in name) if args.only_params else name.startswith("plain"):
            models = {"actor": flop_params(trainer.actor_module),
                      "critic": flop_params(trainer.critic_module)}
            report(args, params, samples, name, setting, models,
                   (timing.score_s, timing.update_s), peak, dtype)
        del trainer
    print_side_by_side(timings, samples, layers)
    if not settings.lora and not args.only_params:
        print("  (ppo.lora is false: the LoRA-top and shared-trunk variants are skipped)")


def print_side_by_side(timings: dict[str, Timing], samples: list[dict], layers: int) -> None:
    """Score + update seconds per setting, its trunk depth, and its speed-up over plain; then
    the shared trunk's speed-up (on vs off) for each LoRA variant timed both ways."""
    plain = next((t for name, t in timings.items() if name.startswith("plain")), None)
    if plain is None:
        return
    tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in samples)
    print("\nside by side (same batch, same run): score + update, speed-up vs plain")
    for name, t in timings.items():
        print(f"  {name:46s} trunk {t.depth}/{layers}  score {t.score_s:7.2f} s  update "
              f"{t.update_s:7.2f} s  total {t.total_s:7.2f} s  {tokens / t.total_s:6.0f} "
              f"tokens/s  x{plain.total_s / t.total_s:5.2f}")
    for label, off, on in trunk_pairs(list(timings)):
        speedup = timings[off].total_s / timings[on].total_s
        print(f"  shared trunk on vs off ({label}): x{speedup:5.2f}   (depth "
              f"{timings[on].depth} of {layers} layers)")


def report(args, params, samples, name, setting, models, seconds, peak, dtype) -> None:
    """FLOP/s of one variant against the matmul peak. Tokens count every prompt token, so with a
    shared prefix or top-layer LoRA the figure is effective (the plain layout's work per second)."""
    score_s, update_s = seconds
    (_, n_actor), (_, n_critic) = models["actor"], models["critic"]
    tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in samples)
    update = 6 * (n_actor + n_critic) * tokens * setting.ppo_epochs
    lora_update = 4 * (n_actor + n_critic) * tokens * setting.ppo_epochs
    forwards = 2 * (2 * n_actor + n_critic) * tokens  # old + ref logprobs, values
    prompt = statistics.mean(len(r["prompt_ids"]) for r in samples)
    response = statistics.mean(len(r["response_ids"]) for r in samples)
    effective = setting.share_prefix or setting.lora_layers
    print(f"PPO update ({name}): {len(samples)} turns ({params.rollout.n_envs} envs x "
          f"{params.rollout.turns_per_env}), prompt {prompt:.0f} + response {response:.0f} "
          f"tokens/turn, {'sampled' if args.generate else 'canned'} replies; ppo_epochs="
          f"{setting.ppo_epochs} mini={setting.mini_batch_size} micro={setting.micro_batch_size} "
          f"lora={setting.lora} lora_layers={setting.lora_layers} "
          f"share_prefix={setting.share_prefix} share_trunk={setting.share_trunk} "
          f"bf16={setting.bf16}, "
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
