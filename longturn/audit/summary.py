"""`summary RUN_DIR`: what a run holds and how its episodes ended, overall, per rank, per iteration."""

from __future__ import annotations

import pandas as pd

from longturn.audit.output import Output, table
from longturn.audit.reasons import FLAG_COLUMNS, ORDER, reason_counts, turn_reasons
from longturn.audit.run_files import Run, read_turns
from longturn.audit.sequences import is_sequence_run, summarise_sequences
from longturn.envs.termination import ABORTED, SUCCESS

COLUMNS = ("iteration", "episode_id", "task", "action_valid", "reward", *FLAG_COLUMNS)


def _stats(group: pd.DataFrame) -> dict[str, float | int]:
    """Counts of one group of turns; success rate over episodes that ended on their own."""
    counts = reason_counts(group["reason"])
    ended = sum(n for r, n in counts.items() if r != "continues")
    decided = ended - sum(counts.get(r, 0) for r in ABORTED)
    return {"turns": len(group), "episodes": int(group["episode_id"].nunique()), "ended": ended,
            "success_rate": counts[SUCCESS] / decided if decided else float("nan"),
            "valid_action_ratio": float(group["action_valid"].mean()),
            "mean_reward": float(group["reward"].mean()), **counts}


def _by(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    rows = [{key: value.item() if hasattr(value, "item") else value, **_stats(group)}
            for value, group in frame.groupby(key, sort=True)]
    return pd.DataFrame(rows)


def summarise(run: Run) -> Output:
    if is_sequence_run(run):  # one row per episode: episode counts, no turn flags
        return summarise_sequences(run)
    frame = read_turns(run, COLUMNS, optional=("termination",))
    frame["reason"] = turn_reasons(frame)
    overall = _stats(frame)
    iterations = sorted(int(i) for i in frame["iteration"].unique())
    ranks = sorted(int(r) for r in frame["rank"].unique())
    by_rank, by_iteration, by_task = (_by(frame, k) for k in ("rank", "iteration", "task"))
    data = {"run": str(run.root), "kind": run.kind, "files": len(run.files),
            "iterations": iterations, "ranks": ranks,
            "tasks": sorted(str(t) for t in frame["task"].unique()), "overall": overall,
            "per_rank": by_rank, "per_iteration": by_iteration, "per_task": by_task}
    span = f" ({iterations[0]}..{iterations[-1]})" if iterations else ""
    successes = overall[SUCCESS]
    decided = overall["ended"] - sum(overall.get(r, 0) for r in ABORTED)
    reasons = " · ".join(f"{r} {overall[r]}" for r in ORDER)
    text = "\n".join([
        f"run: {run.root} ({run.kind}, {len(run.files)} file(s))",
        f"iterations: {len(iterations)}{span}   ranks: {len(ranks)}   "
        f"tasks: {', '.join(data['tasks'])}",
        f"turns: {overall['turns']}   episodes: {overall['episodes']} "
        f"({overall['ended']} ended, {overall['episodes'] - overall['ended']} still running)",
        f"success: {successes}/{decided} episodes that ended on their own"
        + (f" ({successes / decided:.3f})" if decided else ""),
        f"valid-action ratio: {overall['valid_action_ratio']:.3f}   "
        f"mean reward per turn: {overall['mean_reward']:.4f}",
        f"termination reasons (turns): {reasons}",
        "", "per rank:", table(by_rank), "", "per task:", table(by_task),
        "", "per iteration:", table(by_iteration),
    ])
    return Output(text, data)
