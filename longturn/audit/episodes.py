"""`episodes RUN_DIR`: one row per episode, filtered by task, outcome, length or iteration."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from longturn.audit.output import Output, table
from longturn.audit.reasons import FLAG_COLUMNS, turn_reasons
from longturn.audit.run_files import Run, read_turns
from longturn.envs.termination import SUCCESS

COLUMNS = ("iteration", "episode_id", "task", "turn", "step", "env_index", "action_valid",
           "reward", "env_reward", *FLAG_COLUMNS)


@dataclass(frozen=True)
class EpisodeFilter:
    """Which episodes to list; None means any."""

    task: str | None = None
    success: bool | None = None
    min_length: int | None = None
    max_length: int | None = None
    iteration: int | None = None


def episode_table(run: Run) -> pd.DataFrame:
    """Per episode: task, rank, iterations it spans, turns stored, return, validity, how it ended
    (`continues` while the run still plays it)."""
    frame = read_turns(run, COLUMNS, optional=("termination",))
    frame["reason"] = turn_reasons(frame)
    frame = frame.sort_values(["iteration", "rank", "step", "env_index"], kind="stable")
    rows = []
    for episode_id, turns in frame.groupby("episode_id", sort=False):
        last = turns.iloc[-1]
        rows.append({
            "episode_id": episode_id, "task": last["task"], "rank": int(last["rank"]),
            "first_iteration": int(turns["iteration"].min()),
            "last_iteration": int(turns["iteration"].max()),
            "length": len(turns), "return": float(turns["reward"].sum()),
            "env_return": float(turns["env_reward"].sum()),
            "valid_action_ratio": float(turns["action_valid"].mean()),
            "success": last["reason"] == SUCCESS, "ended_by": last["reason"],
        })
    return pd.DataFrame(rows)


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
