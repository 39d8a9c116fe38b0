"""`episodes RUN_DIR`: one row per episode, filtered by task, outcome, length or iteration; its
turns are its replies, wherever they sit. An evaluation's episode whose reset failed has no reply:
it is listed from the evaluation's episodes.parquet, of length 0, ended by its reason."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from longturn.audit.output import Output, table
from longturn.audit.reasons import CONTINUES, FLAG_COLUMNS, turn_reasons
from longturn.audit.replies import read_replies
from longturn.audit.run_files import Run
from longturn.envs.termination import ABORTED

COLUMNS = ("iteration", "episode_id", "task", "turn", "step", "env_index", "action_valid",
           "reward", "env_reward", "termination", *FLAG_COLUMNS)


@dataclass(frozen=True)
class EpisodeFilter:
    """Which episodes to list; None means any."""

    task: str | None = None
    success: bool | None = None
    min_length: int | None = None
    max_length: int | None = None
    iteration: int | None = None


def mean_of(values: pd.Series) -> float:
    """Mean of the non-null entries; NaN when none (tool or free-text replies parse no action)."""
    numbers = pd.to_numeric(values, errors="coerce")
    return float(numbers.mean()) if numbers.notna().any() else float("nan")


def episode_table(run: Run) -> pd.DataFrame:
    """Per episode: task, rank, iterations it spans, turns (replies) stored, return, validity,
    how it ended (`continues` while the run still plays it) and whether it succeeded."""
    frame = read_replies(run, COLUMNS)
    frame["reason"] = turn_reasons(frame)
    frame["iteration"] = frame["iteration"].fillna(0).astype(int)
    frame = frame.sort_values(["iteration", "rank", "step", "env_index", "turn"], kind="stable")
    rows = []
    for episode_id, turns in frame.groupby("episode_id", sort=False):
        last = turns.iloc[-1]
        ended = last["reason"] != CONTINUES and last["reason"] not in ABORTED
        rows.append({
            "episode_id": episode_id, "task": last["task"], "rank": int(last["rank"]),
            "first_iteration": int(turns["iteration"].min()),
            "last_iteration": int(turns["iteration"].max()),
            "length": len(turns), "return": float(turns["reward"].sum()),
            "env_return": float(pd.to_numeric(turns["env_reward"]).sum(min_count=1)),
            "valid_action_ratio": mean_of(turns["action_valid"]),
            "success": bool(ended and last["success"]), "ended_by": last["reason"],
        })
    for _, episode in unstarted_episodes(run).iterrows():
        rows.append({"episode_id": episode["episode_id"], "task": episode["task"], "rank": 0,
                     "first_iteration": 0, "last_iteration": 0, "length": 0, "return": 0.0,
                     "env_return": float("nan"), "valid_action_ratio": float("nan"),
                     "success": False, "ended_by": episode["termination"]})
    return pd.DataFrame(rows)


def unstarted_episodes(run: Run) -> pd.DataFrame:
    """An evaluation's episodes that never had a reply (their env's reset failed): only its
    episodes.parquet holds them, since they have no sample."""
    columns = ["episode_id", "task", "length", "termination"]
    if run.episodes_file is None:
        return pd.DataFrame(columns=columns)
    rows = pd.read_parquet(run.episodes_file, columns=columns)
    return rows[rows["length"] == 0].reset_index(drop=True)


def select(episodes: pd.DataFrame, which: EpisodeFilter) -> pd.DataFrame:
    keep = pd.Series(True, index=episodes.index)
    if which.task is not None:
        keep &= episodes["task"] == which.task
    if which.success is not None:
        keep &= episodes["success"] == which.success
    if which.min_length is not None:
        keep &= episodes["length"] >= which.min_length
    if which.max_length is not None:
        keep &= episodes["length"] <= which.max_length
    if which.iteration is not None:
        keep &= ((episodes["first_iteration"] <= which.iteration)
                 & (episodes["last_iteration"] >= which.iteration))
    return episodes[keep].reset_index(drop=True)


def list_episodes(run: Run, which: EpisodeFilter, limit: int | None = None) -> Output:
    episodes = episode_table(run)
    chosen = select(episodes, which) if len(episodes) else episodes
    shown = chosen.head(limit) if limit is not None else chosen
    more = f"\n… {len(chosen) - len(shown)} more (--limit)" if len(shown) < len(chosen) else ""
    text = f"{len(chosen)} of {len(episodes)} episodes\n{table(shown)}{more}"
    return Output(text, shown)
