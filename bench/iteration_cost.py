"""Seconds per training turn of the whole train loop: GAE with a critic against a critic-free
estimator (GiGPO by default), on the same params, in one run.

Why: a critic costs a forward pass in scoring (values, bootstrap values) and a forward/backward in
every update, and its model, optimizer state and checkpoint; a critic-free estimator has none of
that but plays whole episodes. This says what the swap buys per turn trained on.

How: `run_training` (the train stage's own loop: rollout, scoring, Parquet, update, weight push)
runs --iterations iterations with the params file as given except `algo.advantage`, once per
estimator, in fresh temp dirs, the base model standing in for the warm critic (its value head
starts at random: cost, not learning, is measured). The two alternate for --rounds rounds (GAE
first in odd rounds, last in even ones: a later run in the same process can be faster or slower),
and each estimator's fastest round is kept. Per estimator it prints the seconds per training turn
of each phase and in all, summed over the iterations after the first (the first pays one-off
allocations), and the ratio. A critic-free iteration plays groups of
`algo.group_size` episodes to their end, so its turn count differs from GAE's fixed
n_envs × turns_per_env: compare the per-turn figures, not the iteration times.

--tiny: the tiny random model, 4 envs, groups of 2, episodes of at most 2 turns, 2 iterations
after the first: a smoke run whose ratio means little.

    .venv/bin/python bench/iteration_cost.py [--params params.yaml] [--iterations 3]
        [--rounds 2] [--against gigpo|grpo] [--model-dir DIR] [--tiny [--tiny-dir DIR]]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from longturn.params.config import load_params, parse_params  # noqa: E402
from longturn.run.training import TrainPaths, run_training  # noqa: E402
from cpu_threads import add_threads_arg, use_threads  # noqa: E402
from tiny_model import add_tiny_args, fill_defaults, resolve_model_dir  # noqa: E402

FULL = {"iterations": 3, "rounds": 2}
TINY = {"iterations": 3, "rounds": 1}
PHASES = ("rollout", "scoring", "update", "sync", "checkpoint")


def variant(params, model_dir: str, advantage: str, iterations: int, tiny: bool):
    """The params with this estimator and model, sized down under --tiny."""
    raw = params.model_dump()
    raw["model"]["source"] = model_dir
    raw["algo"]["advantage"] = advantage
    raw["train"].update(iterations=iterations, checkpoint_every=iterations, push=False)
    if tiny:
        raw["model"]["dtype"] = "float32"
        raw["env"].update(max_turns=2, workers=False, step_timeout_s=None)
        raw["engine"].update(name="hf", device="cpu", batch_size=4)
        raw["engine"]["sampling"]["max_new_tokens"] = 4
        raw["rollout"].update(n_envs=4, turns_per_env=2)
        raw["algo"]["group_size"] = 2
        raw["ppo"].update(mini_batch_size=4, micro_batch_size=2, bf16=False, lora=True,
                          lora_layers=1)
    return parse_params(raw)


def seconds_per_turn(history: list[dict[str, float]]) -> dict[str, float]:
    """Per-phase and total seconds per training turn over the iterations after the first."""
    timed = history[1:] or history
    turns = sum(h["turns"] for h in timed)
    out = {p: sum(h.get(f"seconds_{p}", 0.0) for h in timed) / turns for p in PHASES}
    out["total"] = sum(h["seconds_per_iteration"] for h in timed) / turns
    out["turns"] = turns
    return out


def measure(params, model_dir: str, advantage: str, iterations: int, tiny: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        paths = TrainPaths(base=Path(model_dir), critic=Path(model_dir),
                           trajectories=out / "trajectories", checkpoints=out / "checkpoints",
                           final=out / "final", live=out / "live", policy=out / "policy")
        history = run_training(variant(params, model_dir, advantage, iterations, tiny), paths,
                               progress=False, run_id=f"bench-{advantage}")
    return seconds_per_turn(history)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--model-dir", default=str(ROOT / "data/models/base"))
    ap.add_argument("--iterations", type=int, default=None,
                    help="iterations per estimator (the first is not timed; default 3)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="alternating runs per estimator, the fastest kept (default 2)")
    ap.add_argument("--against", choices=("gigpo", "grpo"), default="gigpo")
    add_threads_arg(ap)
    add_tiny_args(ap)
    args = fill_defaults(ap.parse_args(), FULL, TINY)
    if args.iterations < 2 or args.rounds < 1:
        ap.error("--iterations must be >= 2 (the first is not timed) and --rounds >= 1")
    logging.basicConfig(level=logging.WARNING)
    threads = use_threads(args.threads)
    params = load_params(args.params)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = resolve_model_dir(args, tmp)
        runs: dict[str, list[dict]] = {"gae": [], args.against: []}
        for round_ in range(args.rounds):
            order = ("gae", args.against) if round_ % 2 == 0 else (args.against, "gae")
            for name in order:
                runs[name].append(measure(params, model_dir, name, args.iterations, args.tiny))
    results = {name: min(r, key=lambda x: x["total"]) for name, r in runs.items()}
    print(f"seconds per training turn, {args.iterations - 1} timed iteration(s) each, fastest "
          f"of {args.rounds} alternating round(s), params {Path(args.params).name}"
          f"{' (--tiny sizes)' if args.tiny else ''}, torch threads={threads}:")
    for name, r in results.items():
        phases = "  ".join(f"{p} {r[p]:.4f}" for p in PHASES)
        print(f"  {name:6s}: {r['total']:.4f} s/turn over {r['turns']:.0f} turns  ({phases})")
    gae, other = results["gae"]["total"], results[args.against]["total"]
    print(f"  ratio gae / {args.against}: {gae / other:.2f}x "
          f"({'cheaper' if other < gae else 'dearer'} per turn without a critic)")


if __name__ == "__main__":
    main()
