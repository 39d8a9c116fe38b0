"""The update and a critic warm-up refit with the frozen trunk's rows kept from scoring, against
running the trunk again, side by side on the same samples.

Why: with LoRA on the top layers, the trunk below them (22 of SmolLM2's 30 layers) never trains,
so scoring keeps each row's trunk output (`algo/trunk_rows.py`) and the update, and a warm-up
refit's re-scoring, assemble their batches from it. This measures what that buys at params.yaml's
settings, and how much memory it holds.

How: one Parquet part of training samples: --part (a stored iteration's `part-00.parquet`), or
one rollout batch of the real collector answered by ppo_update.py's canned engine
(engine.sampling.max_new_tokens tokens per reply). One trainer (params.yaml's settings, the base
model as actor and critic) scores it untimed (keeping its rows) and runs one untimed update (the
optimizer state); then, --rounds times, alternating "old" (`models.trunk_rows` None: the trunk
runs as before) and "new" (rows kept): `trainer.update([part])`, then a warm-up refit, as
run/warmup.py runs one after its first: re-scoring with the logprobs kept, then a critic-only
update of warmup.sample_fraction of the samples. Medians and new/old speed-ups are printed.

    .venv/bin/python bench/trunk_reuse.py [--part PATH] [--rounds 2] [--model-dir DIR]
        [--[no-]bf16] [--threads N] [--tiny [--tiny-dir DIR]]

--tiny: the tiny random model, 2 envs x 2 turns, 8-token replies, LoRA on the top 1 of its 2
layers, one round: a smoke run whose ratios mean little.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from longturn.algo.trainer import PPOTrainer  # noqa: E402
from longturn.params.config import load_params  # noqa: E402
from longturn.run.models import load_tokenizer  # noqa: E402
from longturn.run.wiring import gae_params, trainer_settings  # noqa: E402
from longturn.trajectories import read_table, write_samples  # noqa: E402
from cpu_threads import add_threads_arg, use_threads  # noqa: E402
from ppo_update import collect_batch  # noqa: E402
from tiny_model import add_tiny_args, fill_defaults, resolve_model_dir  # noqa: E402

FULL = {"envs": None, "turns": None, "response_tokens": None, "lora_layers": None, "rounds": 2,
        "bf16": None}
TINY = {"envs": 2, "turns": 2, "response_tokens": 8, "lora_layers": 1, "rounds": 1,
        "bf16": False}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--model-dir", default=str(ROOT / "data/models/base"))
    ap.add_argument("--part", default=None, help="a stored part-00.parquet (default: collect)")
    ap.add_argument("--envs", type=int, default=None, help="default rollout.n_envs; --tiny 2")
    ap.add_argument("--turns", type=int, default=None,
                    help="default rollout.turns_per_env; --tiny 2")
    ap.add_argument("--response-tokens", type=int, default=None,
                    help="canned reply length (default engine.sampling.max_new_tokens; --tiny 8)")
    ap.add_argument("--lora-layers", type=int, default=None,
                    help="default ppo.lora_layers; --tiny 1")
    ap.add_argument("--rounds", type=int, default=None, help="old/new pairs (default 2; --tiny 1)")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="bf16 autocast (default ppo.bf16; --tiny off)")
    ap.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)  # collect_batch's
    add_threads_arg(ap)
    add_tiny_args(ap)
    return fill_defaults(ap.parse_args(), FULL, TINY)


def samples_of(args: argparse.Namespace, params, model_dir: str, tokenizer) -> list[dict]:
    """The part's samples, or one collected batch as samples."""
    if args.part:
        return read_table(args.part).to_pylist()
    return collect_batch(params, model_dir, tokenizer, args)


def timed(call: Callable[[], object]) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds (all threads): on a shared machine the CPU
    seconds move less with the neighbours' load."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def run(args: argparse.Namespace, model_dir: str, tmp: Path) -> None:
    params = load_params(args.params)
    params.rollout.n_envs = args.envs or params.rollout.n_envs
    params.rollout.turns_per_env = args.turns or params.rollout.turns_per_env
    threads = use_threads(args.threads)
    tokenizer = load_tokenizer(model_dir)
    settings = trainer_settings(params)
    settings = replace(settings, lora_layers=args.lora_layers or settings.lora_layers,
                       bf16=settings.bf16 if args.bf16 is None else args.bf16)
    trainer = PPOTrainer(model_dir, model_dir, settings, gae_params(params), tokenizer)
    models = trainer.models
    kept = models.trunk_rows
    if kept is None or models.depth == 0:
        sys.exit(f"no trunk to keep (depth {models.depth}): these settings run every layer")
    samples = samples_of(args, params, model_dir, tokenizer)
    part = write_samples(trainer.score(samples), tmp / "part.parquet")
    rng = np.random.default_rng(params.seed)  # the warm-up's pick of sample_fraction
    size = max(1, math.ceil(params.warmup.sample_fraction * len(samples)))
    picked = write_samples([samples[i] for i in sorted(rng.choice(len(samples), size, False))],
                           tmp / "picked.parquet")
    trainer.update([str(part)])  # untimed: allocates the optimizer state
    tokens = sum(len(s["prompt_ids"]) + len(s["response_ids"]) for s in samples)
    print(f"trunk reuse: {len(samples)} samples, {tokens} tokens, trunk {models.depth} of "
          f"{len(models.actor_decoder.layers)} layers, ppo_epochs={settings.ppo_epochs} "
          f"mini={settings.mini_batch_size} micro={settings.micro_batch_size} "
          f"bf16={settings.bf16}, torch threads={threads}")
    print(f"  kept               : {kept.nbytes / 2**20:8.1f} MiB ({len(kept)} rows)")

    def refit() -> None:
        trainer.score(samples, reuse_logprobs=True)
        trainer.update([str(picked)], train_actor=False)

    times: dict[str, dict[str, list[tuple[float, float]]]] = {"update": {}, "warm-up refit": {}}
    for _ in range(args.rounds):
        for phase, call in (("update", lambda: trainer.update([str(part)])),
                            ("warm-up refit", refit)):
            for variant in ("old", "new"):
                models.trunk_rows = None if variant == "old" else kept
                hits, misses = kept.hits, kept.misses
                wall, cpu = timed(call)
                times[phase].setdefault(variant, []).append((wall, cpu))
                done = (f"  (trunk: {kept.hits - hits} batches assembled, {kept.misses - misses} "
                        "run)" if variant == "new" else "")
                print(f"  {phase:13s} {variant} : {wall:8.2f} s, CPU {cpu:8.2f} s{done}")
    for phase, by_variant in times.items():
        old, new = ([statistics.median(t[k] for t in by_variant[v]) for k in (0, 1)]
                    for v in ("old", "new"))
        print(f"{phase}: old {old[0]:.2f} s, new {new[0]:.2f} s (median of {args.rounds}): "
              f"x{old[0] / new[0]:.2f}; CPU s: old {old[1]:.2f}, new {new[1]:.2f}: "
              f"x{old[1] / new[1]:.2f}")


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(args, resolve_model_dir(args, tmp), Path(tmp))


if __name__ == "__main__":
    main()
