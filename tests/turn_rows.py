"""Batches for tests and benches written as flat turn rows, one reply each: a row's columns are a
sample's and its one reply's side by side, so a test says a turn in one dict. `samples_from_turns`
makes samples of the one schema (longturn/trajectories.py) of them, each reply spanning its whole
response. Nothing in longturn/ plays or writes turn rows: every rollout hands on samples."""

from __future__ import annotations

from typing import Any, Iterable

from longturn.trajectories import REPLY_TYPE, SAMPLE_SCHEMA

Row = dict[str, Any]

# a row's columns that are the sample's
SAMPLE_COLUMNS = ("run_id", "policy_version", "iteration", "env_index", "env_name", "task",
                  "episode_id", "episode_seed", "group_id", "prompt_ids", "response_ids",
                  "prompt_text", "engine_logprobs", "old_logprobs", "ref_logprobs", "values",
                  "token_rewards", "advantages", "returns", "bootstrap_prompt_ids", "images",
                  "image_starts", "bootstrap_images", "bootstrap_image_starts")
# a row's columns that describe its one reply
REPLY_COLUMNS = ("turn", "step", "response_text", "raw_action", "action", "action_valid",
                 "action_failure", "env_reward", "reward", "terminated", "truncated", "success",
                 "aborted", "segment_end", "termination", "finish_reason", "history_dropped",
                 "next_value", "logprob_gap", "observation")


def sample_from_turn(row: Row) -> Row:
    """A turn row as a sample with one reply spanning its whole response (absent columns null)."""
    sample: Row = dict.fromkeys(SAMPLE_SCHEMA.names)
    sample.update({name: row.get(name) for name in SAMPLE_COLUMNS})
    response = row.get("response_ids")
    n = len(response) if response is not None else 0
    sample["loss_mask"] = [1] * n
    sample["replies"] = [{**{field.name: None for field in REPLY_TYPE}, "start": 0, "end": n,
                          **{name: row.get(name) for name in REPLY_COLUMNS}}]
    return sample


def samples_from_turns(rows: Iterable[Row]) -> list[Row]:
    return [sample_from_turn(row) for row in rows]
