"""The campaign's figures gathered from what its parts wrote: evaluations paired seed by seed,
the train stage's per-iteration log, GPU utilisation per stage, the engine bench, the profile.

Every figure goes into results.json as {"value": ..., "command": ...}, so no number travels
without the command that produced it."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from campaign.gpu_sampler import read_samples, window_means
from longturn.report.build import read_live_metrics
from longturn.report.training import pool_success_blocks
from longturn.stats import paired_outcomes, wilson_interval

# Issue 9's goals for the one-GPU profile, from the first H100 run (11.9 training turns/s).
GOALS = {"train_turns_per_s": 8 * 11.9, "train_gpu_utilization": 70.0,
         "engine_vs_generate_at_512": 10.0}


def figure(value: Any, command: str) -> dict[str, Any]:
    return {"value": value, "command": command}


def _episodes(eval_dir: Path) -> pd.DataFrame | None:
    path = eval_dir / "episodes.parquet"
    return pd.read_parquet(path) if path.is_file() else None


def paired_evaluation(work: Path, commands: dict[str, str]) -> dict[str, Any]:
    """Zero-shot vs final per task on the same seeds: k/n with Wilson intervals, lost, gained,
    exact McNemar p."""
    zs, fin = _episodes(work / "data/eval/zero_shot"), _episodes(work / "data/eval/final")
    if zs is None or fin is None:
        return {}
    command = f"{commands.get('zero_shot_eval', '')} ; {commands.get('final_eval', '')}"
    out = {}
    for task, o in paired_outcomes(zs, fin).items():
        rows_zs = zs if task == "overall" else zs[zs["task"] == task]
        rows_fin = fin if task == "overall" else fin[fin["task"] == task]
        k0, n0 = int(rows_zs["success"].sum()), len(rows_zs)
        k1, n1 = int(rows_fin["success"].sum()), len(rows_fin)
        out[task] = figure({"zero_shot": [k0, n0], "final": [k1, n1],
                            "zero_shot_ci": wilson_interval(k0, n0),
                            "final_ci": wilson_interval(k1, n1), "lost": o.lost,
                            "gained": o.gained, "pairs": o.n_pairs, "mcnemar_p": o.p_value},
                           command)
    return out


def tool_use(work: Path, commands: dict[str, str], protocol: str | None) -> dict[str, Any]:
    """The chat protocol: share of episodes with a tool call, calls per episode, valid calls,
    before and after, paired on seeds for 'used the tool' (nothing for the action protocol,
    which has no tools: its zeros would read as a finding)."""
    if protocol != "chat":
        return {}
    files = {side: work / f"data/eval/{side}/turns.parquet" for side in ("zero_shot", "final")}
    if not all(f.is_file() for f in files.values()):
        return {}
    frames = {side: pd.read_parquet(f) for side, f in files.items()}
    if not all("tool_calls" in f.columns for f in frames.values()):
        return {}
    frames = {side: _episode_ends(f) for side, f in frames.items()}
    out: dict[str, Any] = {}
    for side, f in frames.items():
        calls, errors = int(f["tool_calls"].sum()), int(f["tool_errors"].sum())
        out[side] = {"episodes": len(f), "with_tool_call": int((f["tool_calls"] > 0).sum()),
                     "calls_per_episode": calls / max(len(f), 1),
                     "valid_call_share": (calls - errors) / calls if calls else None,
                     "accuracy": float(f["success"].mean()) if len(f) else None}
    used = {side: f.assign(success=f["tool_calls"] > 0) for side, f in frames.items()}
    o = paired_outcomes(used["zero_shot"], used["final"])["overall"]
    out["used_tool_paired"] = {"lost": o.lost, "gained": o.gained, "mcnemar_p": o.p_value}
    command = f"{commands.get('zero_shot_eval', '')} ; {commands.get('final_eval', '')}"
    return figure(out, command)


def _episode_ends(samples: pd.DataFrame) -> pd.DataFrame:
    """One row per conversation episode: the sample that ends it (it carries the episode's
    tool counts; docs/design.md §4), with `success` from its last reply (none: no reply fitted)."""
    ends = samples[samples["tool_calls"].notna()].copy()
    ends["success"] = [bool(len(r) and r[-1]["success"]) for r in ends["replies"]]
    return ends


def _median(df: pd.DataFrame, key: str) -> float | None:
    return float(df[key].median()) if key in df.columns and df[key].notna().any() else None


def training(work: Path, commands: dict[str, str]) -> dict[str, Any]:
    """Per-iteration log of the train stage: medians of time per phase and throughput, and
    training success pooled over the first and the second half of the ended episodes."""
    df = read_live_metrics(work / "data/train/live")
    if df.empty:
        return {}
    partial = work / "data/train/final/PARTIAL.json"
    phases = {k[len("seconds_"):]: _median(df, k) for k in df.columns
              if k.startswith("seconds_") and k != "seconds_per_iteration"}
    out = {"iterations": int(len(df)),
           "stopped_early": json.loads(partial.read_text()) if partial.is_file() else None,
           "seconds_per_iteration_median": _median(df, "seconds_per_iteration"),
           "turns_per_s_median": _median(df, "turns_per_s"),
           "phase_seconds_median": phases,
           "peak_gpu_memory_gib_max": float(df["peak_gpu_memory_gib"].max())
           if "peak_gpu_memory_gib" in df.columns else None}
    # pooled by ended episodes, never a mean of per-iteration rates: episodes that start
    # together hit the time limit together, so the per-iteration rate swings every other
    # iteration (0.39, 0.06, 0.39, ... on 2026-11-28)
    out["success_halves"] = [asdict(b) for b in pool_success_blocks(df, target_blocks=2)]
    return figure(out, commands.get("train", ""))


def gpu_per_stage(samples_path: Path, stages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    samples = read_samples(samples_path)
    out = {}
    for name, part in stages.items():
        if samples and part.get("started") and part.get("ended"):
            means = window_means(samples, part["started"], part["ended"])
            if means is not None:
                out[name] = figure(means, "nvidia-smi --query-gpu=timestamp,utilization.gpu,"
                                          "memory.used --format=csv,noheader,nounits -l 1")
    return out


def goals(results: dict[str, Any]) -> dict[str, Any]:
    """The one-GPU goals against this run's figures (None where the run has no figure)."""
    train = results.get("training", {}).get("value", {})
    util = results.get("gpu_utilization", {}).get("train", {}).get("value", {})
    engine = results.get("engine_throughput", {}).get("value", {}).get("batches", {}).get("512")
    measured = {"train_turns_per_s": train.get("turns_per_s_median"),
                "train_gpu_utilization": util.get("utilization_mean"),
                "engine_vs_generate_at_512": engine["engine_vs_generate"] if engine else None}
    return {k: {"goal": GOALS[k], "measured": v, "met": None if v is None else v >= GOALS[k]}
            for k, v in measured.items()}
