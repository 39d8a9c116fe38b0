"""`summary RUN_DIR`: what a run holds and how its episodes ended, overall, per rank, per task and
per iteration. Counts are of replies ("turns"), samples and episodes, so a packed whole episode
ends on its last reply like a window episode on its last turn; an evaluation's episodes whose
reset failed have no reply, and its episodes.parquet counts them."""

from __future__ import annotations

import math

import pandas as pd

from longturn.audit.episodes import mean_of, unstarted_episodes
from longturn.audit.output import Output, table
from longturn.audit.reasons import FLAG_COLUMNS, reason_counts, turn_reasons
from longturn.audit.replies import read_replies
from longturn.audit.run_files import Run
from longturn.envs.termination import ABORTED

COLUMNS = ("iteration", "episode_id", "task", "action_valid", "reward", "termination",
           *FLAG_COLUMNS)
SAMPLE_COLUMNS = ("tool_calls", "tool_errors", "tokenization_check")


def _ratio(top: float, bottom: float) -> float:
    return top / bottom if bottom else float("nan")


def _stats(group: pd.DataFrame, tools: bool) -> dict[str, float | int]:
    """Counts of one group of replies; success rate over episodes that ended on their own (the
    success flag of their last reply), tool calls over the group's samples."""
    counts = reason_counts(group["reason"])
    decided = _decided(group)
    successes = int((decided & group["success"].fillna(False).astype(bool)).sum())
    out: dict[str, float | int] = {
        "turns": len(group), "samples": int(group["sample"].nunique()),
        "episodes": int(group["episode_id"].nunique()),
        "ended": int((group["reason"] != "continues").sum()),
        "successes": successes, "success_rate": _ratio(successes, int(decided.sum())),
        "valid_action_ratio": mean_of(group["action_valid"]),  # null where no rollout said
        "mean_reward": float(group["reward"].mean()),
    }
    if tools:
        samples = group.drop_duplicates("sample")
        calls = float(samples["tool_calls"].fillna(0).sum())
        errors = float(samples["tool_errors"].fillna(0).sum())
        out.update(tool_calls=int(calls),
                   tool_calls_per_episode=_ratio(calls, out["episodes"]),
                   tool_call_validity=_ratio(calls - errors, calls))
    return {**out, **counts}


def _decided(group: pd.DataFrame) -> pd.Series:
    """Replies that end an episode on its own: ended, and not aborted (an env's failure, or an
    agent's error or timeout, whatever its reason's name)."""
    aborted = group["aborted"].fillna(False).astype(bool) | group["reason"].isin(ABORTED)
    return (group["reason"] != "continues") & ~aborted


def _by(frame: pd.DataFrame, key: str, tools: bool) -> pd.DataFrame:
    rows = [{key: value.item() if hasattr(value, "item") else value, **_stats(group, tools)}
            for value, group in frame.groupby(key, sort=True, dropna=False)]
    table_ = pd.DataFrame(rows)
    if len(table_):  # a reason one group lacks counts 0 there
        reasons = list(reason_counts(frame["reason"]))
        table_[reasons] = table_[reasons].fillna(0).astype(int)
    return table_


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def summarise(run: Run) -> Output:
    frame = read_replies(run, (*COLUMNS, *SAMPLE_COLUMNS))
    frame["reason"] = turn_reasons(frame)
    frame["iteration"] = frame["iteration"].fillna(0).astype(int)
    tools = bool(frame["tool_calls"].notna().any())
    overall = _stats(frame, tools)
    iterations = sorted(int(i) for i in frame["iteration"].unique())
    ranks = sorted(int(r) for r in frame["rank"].unique())
    by_rank, by_iteration, by_task = (_by(frame, k, tools) for k in ("rank", "iteration", "task"))
    checks = frame.drop_duplicates("sample")["tokenization_check"].dropna()
    tokenization = {str(k): int(v) for k, v in checks.value_counts().sort_index().items()}
    data = {"run": str(run.root), "kind": run.kind, "files": len(run.files),
            "iterations": iterations, "ranks": ranks,
            "tasks": sorted(str(t) for t in frame["task"].unique()), "overall": overall,
            "tokenization_check": tokenization,
            "per_rank": by_rank, "per_iteration": by_iteration, "per_task": by_task}
    unstarted = unstarted_episodes(run)["termination"].value_counts().sort_index()
    data["unstarted"] = {str(k): int(v) for k, v in unstarted.items()}
    span = f" ({iterations[0]}..{iterations[-1]})" if iterations else ""
    decided = int(_decided(frame).sum())
    reasons = " · ".join(f"{r} {n}" for r, n in reason_counts(frame["reason"]).items())
    lines = [
        f"run: {run.root} ({run.kind}, {len(run.files)} file(s))",
        f"iterations: {len(iterations)}{span}   ranks: {len(ranks)}   "
        f"tasks: {', '.join(data['tasks'])}",
        f"turns (replies): {overall['turns']} in {overall['samples']} sample(s)   episodes: "
        f"{overall['episodes']} ({overall['ended']} ended, "
        f"{overall['episodes'] - overall['ended']} still running)"
        + (f"; {int(unstarted.sum())} more never started (reset failed: "
           + ", ".join(f"{k} {v}" for k, v in data["unstarted"].items()) + ")"
           if len(unstarted) else ""),
        f"success: {overall['successes']}/{decided} episodes that ended on their own"
        + (f" ({overall['successes'] / decided:.3f})" if decided else ""),
        f"valid-action ratio: {_number(overall['valid_action_ratio'])}   "
        f"mean reward per turn: {overall['mean_reward']:.4f}",
    ]
    if tools:
        lines.append(f"tool calls: {overall['tool_calls']} "
                     f"({overall['tool_calls_per_episode']:.2f} per episode)   "
                     f"tool-call validity: {_number(overall['tool_call_validity'])}")
    lines.append(f"termination reasons (turns): {reasons}")
    if tokenization:
        lines.append("tokenization check: "
                     + " · ".join(f"{k} {n}" for k, n in tokenization.items()))
    lines += ["", "per rank:", table(by_rank), "", "per task:", table(by_task),
              "", "per iteration:", table(by_iteration)]
    return Output("\n".join(lines), data)

