"""Success after the same number of training turns: GAE (critic) against GRPO and GiGPO
(critic-free), each a whole DVC experiment on one params file, in one run.

Why: `algo.advantage` is one key, so the question a user asks is which value to set. Cost per turn
is `bench/iteration_cost.py`; this measures what the turns buy, on the final evaluation's seeds,
which every experiment plays identically.

How: in a DVC workspace (a clone of the repo with its venv on PATH), `dvc exp run -S
algo.advantage=X` runs for the critic-free estimators first with --free-iterations iterations. A
critic-free iteration plays whole episodes, so its turn count varies; GAE then runs the number of
its fixed n_envs × turns_per_env iterations that comes closest to the critic-free runs' mean turns.
Stages whose inputs did not change (model, validation, zero-shot evaluation) come from DVC's run
cache. After each experiment the final evaluation's episodes and the training turn count are kept;
the table gives success with its Wilson interval, the exact McNemar test against the zero-shot
evaluation, and every pair of estimators against each other on the same seeds. The experiments
stay in `dvc exp show`.

    PATH=.venv/bin:$PATH python bench/compare_estimators.py [--free-iterations 3]
        [--estimators grpo gigpo gae] [--set KEY=VALUE ...] [--out bench-out/estimators]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout

from longturn.params.estimator import ESTIMATORS  # noqa: E402
from longturn.stats import paired_outcomes, wilson_interval  # noqa: E402


def training_turns(train_dir: Path) -> int:
    """Rows of every iteration's trajectory Parquet: the turns the policy was trained on."""
    return ds.dataset(str(train_dir / "trajectories"), format="parquet",
                      partitioning="hive").count_rows()


def run_experiment(name: str, estimator: str, iterations: int, extra: list[str],
                   out: Path) -> dict:
    """`dvc exp run` one estimator; keep its final episodes and turn count under out/name."""
    cmd = ["dvc", "exp", "run", "--name", name, "-S", f"algo.advantage={estimator}",
           "-S", f"train.iterations={iterations}"]
    for setting in extra:
        cmd += ["-S", setting]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    keep = out / name
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "data/eval/final/episodes.parquet", keep / "episodes.parquet")
    if not (out / "zero_shot_episodes.parquet").exists():
        shutil.copy(ROOT / "data/eval/zero_shot/episodes.parquet",
                    out / "zero_shot_episodes.parquet")
    result = {"estimator": estimator, "iterations": iterations,
              "turns": training_turns(ROOT / "data/train")}
    (keep / "result.json").write_text(json.dumps(result))
    return result


def success_line(label: str, episodes: pd.DataFrame, zero_shot: pd.DataFrame | None) -> str:
    k, n = int(episodes["success"].sum()), len(episodes)
    lo, hi = wilson_interval(k, n)
    line = f"{label:<10} {k:>3}/{n:<3} = {k / n:.3f} [{lo:.2f}, {hi:.2f}]"
    if zero_shot is not None:
        pair = paired_outcomes(zero_shot, episodes)["overall"]
        line += f"   vs zero-shot: lost {pair.lost}, gained {pair.gained}, p = {pair.p_value:.3g}"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--free-iterations", type=int, default=3)
    parser.add_argument("--estimators", nargs="+", default=["grpo", "gigpo", "gae"],
                        choices=list(ESTIMATORS))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="passed to every `dvc exp run` as -S")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-out" / "estimators")
    args = parser.parse_args()

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    gae_batch = params["rollout"]["n_envs"] * params["rollout"]["turns_per_env"]
    results = {}
    for estimator in [e for e in args.estimators if not ESTIMATORS[e].has_critic]:
        results[estimator] = run_experiment(f"cmp-{estimator}", estimator,
                                            args.free_iterations, args.set, args.out)
    if "gae" in args.estimators:
        free_turns = [r["turns"] for r in results.values()]
        mean = sum(free_turns) / len(free_turns) if free_turns else gae_batch * args.free_iterations
        results["gae"] = run_experiment("cmp-gae", "gae", max(1, round(mean / gae_batch)),
                                        args.set, args.out)

    zero_shot = pd.read_parquet(args.out / "zero_shot_episodes.parquet")
    episodes = {e: pd.read_parquet(args.out / f"cmp-{e}" / "episodes.parquet") for e in results}
    print("\nfinal evaluation (same seeds for every row)")
    print(success_line("zero-shot", zero_shot, None))
    for e, r in results.items():
        print(success_line(e, episodes[e], zero_shot)
              + f"   [{r['iterations']} iterations, {r['turns']} training turns]")
    print("\npairs on the same seeds (first better / second better, exact McNemar)")
    for a, b in itertools.combinations(results, 2):
        pair = paired_outcomes(episodes[a], episodes[b])["overall"]
        print(f"{a} vs {b}: {a} only {pair.lost}, {b} only {pair.gained}, p = {pair.p_value:.3g}")


if __name__ == "__main__":
    main()
