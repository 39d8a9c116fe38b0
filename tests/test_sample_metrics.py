"""The one metric set of a batch's samples (rollout/sample_metrics.py): ratios over ended episodes
and replies, summed over ranks before dividing. The env tests build turn rows, as the env slots
write them, and convert them as the train loop does; the conversation tests build conversation
records and do the same, so both protocols are read by the same code."""

from __future__ import annotations

import json
import math

import numpy as np

from longturn.rollout import sample_metrics as batch
from longturn.rollout.sample_metrics import action_mix
from longturn.rollout.samples import samples_from_episodes
from turn_rows import samples_from_turns
from longturn.run.metrics import logprob_gap


def rollout_metrics(rows, sum_over_ranks=None):
    return batch.sample_metrics(samples_from_turns(rows), (), sum_over_ranks)


def rollout_totals(rows):
    return batch.sample_totals(samples_from_turns(rows))


def other_rank(rows):
    """An all-reduce with one more rank that played `rows` (no action was parsed on either, so
    the action-mix counts it reduces stay as they are)."""
    totals = rollout_totals(rows)
    contribution = np.array([totals[k] for k in sorted(totals)])
    return lambda values: values + contribution if values.shape == contribution.shape else values


def _row(turn: int, success: bool = False, ended: bool = False, valid: bool = True,
         reward: float = 0.0) -> dict:
    return {"turn": turn, "success": success, "terminated": ended and success,
            "truncated": ended and not success, "aborted": False, "action_valid": valid,
            "reward": reward, "env_reward": max(reward, 0.0), "prompt_ids": [5] * 3,
            "response_ids": [1] * 4,
            "finish_reason": "stop"}


def test_one_rank() -> None:
    rows = [_row(0), _row(5, success=True, ended=True, reward=0.9),
            _row(31, ended=True, valid=False, reward=-0.1)]
    m = rollout_metrics(rows)
    assert m["turns"] == 3 and m["episodes_ended"] == 2
    assert m["success_rate"] == 0.5 and m["episode_length"] == (6 + 32) / 2
    assert m["valid_action_ratio"] == 2 / 3 and math.isclose(m["mean_reward"], 0.8 / 3)


def test_nothing_ended_is_nan() -> None:
    m = rollout_metrics([_row(0), _row(1)])
    assert math.isnan(m["success_rate"]) and math.isnan(m["episode_length"])


def _sample(*gaps: float | None) -> dict:
    return {"replies": [{"logprob_gap": gap} for gap in gaps]}


def test_logprob_gap_is_read_from_the_scored_replies_of_any_sample() -> None:
    """A turn's sample has one reply, a packed episode several: each reply counts once."""
    samples = [_sample(0.1), _sample(0.3, None, 0.5)]
    assert math.isclose(logprob_gap(samples)["logprob_gap"], 0.3)
    assert logprob_gap([_sample(None)]) == {}  # nothing scored with engine logprobs


def test_logprob_gap_sums_ranks_before_dividing() -> None:
    other_rank = np.array([0.9, 3.0])  # three replies of 0.3 on rank 1
    m = logprob_gap([_sample(0.1)], lambda total: total + other_rank)
    assert math.isclose(m["logprob_gap"], 1.0 / 4)


def test_ranks_are_summed_before_dividing() -> None:
    """Rank 0 ended 1 episode (a success), rank 1 ended 3 (failures): 1/4, not mean(1, 0)."""
    rank0 = [_row(2, success=True, ended=True)]
    rank1 = [_row(9, ended=True), _row(9, ended=True), _row(9, ended=True)]
    m = rollout_metrics(rank0, other_rank(rank1))
    assert m["turns"] == 4 and m["episodes_ended"] == 4
    assert m["success_rate"] == 0.25
    assert m["episode_length"] == (3 + 10 * 3) / 4


def test_action_mix_fractions_other_and_ranks() -> None:
    rows = samples_from_turns([{"action": a, "response_ids": [1]}
                               for a in ("go forward", "go forward", "turn left", "dance")])
    mix = action_mix(rows, ["turn left", "turn right", "go forward"])
    assert mix == {"action_mix/turn_left": 0.25, "action_mix/turn_right": 0.0,
                   "action_mix/go_forward": 0.5, "action_mix/other": 0.25}
    doubled = action_mix(rows[:2], ["turn left", "go forward"], lambda a: a + np.array([1, 0, 0]))
    assert doubled == {"action_mix/turn_left": 1 / 3, "action_mix/go_forward": 2 / 3}


def test_termination_reasons_counted_and_aborted_apart() -> None:
    """An aborted episode ends (counted by reason) but is neither a success nor a failure; an
    episode whose reset failed rides on a sample of its batch as `aborted_resets`."""
    rows = [_row(3, success=True, ended=True), _row(7, ended=True),
            {**_row(2), "aborted": True, "termination": "timeout", "reward": 0.0},
            {**_row(4), "terminated": True, "success": False}, _row(0)]
    samples = samples_from_turns(rows)
    samples[-1]["aborted_resets"] = ["env_error", "env_error"]
    m = batch.sample_metrics(samples)
    assert {k: m[f"termination/{k}"] for k in ("success", "failure", "time_limit", "env_error",
                                               "timeout")} == \
        {"success": 1, "failure": 1, "time_limit": 1, "env_error": 2, "timeout": 1}
    assert m["episodes_ended"] == 6 and m["episodes_aborted"] == 3
    assert m["success_rate"] == 1 / 3  # over the three episodes the env did not abort
    assert m["episode_length"] == (4 + 8 + 5) / 3


def test_termination_counts_are_summed_over_ranks() -> None:
    rank1 = [{**_row(1), "aborted": True, "termination": "env_error"}]
    m = rollout_metrics([_row(5, success=True, ended=True)], other_rank(rank1))
    assert m["termination/env_error"] == 1 and m["termination/success"] == 1
    assert m["episodes_aborted"] == 1 and m["success_rate"] == 1.0
    assert sorted(rollout_totals([])) == sorted(rollout_totals(rank1))  # the same on every rank


def _conversation(episode: str, calls: list[bool], termination: str | None = "done",
                  success: bool = False) -> dict:
    """A chat record of one reply per entry of `calls` (True: a tool call that ran, False: one
    that failed), each reply 2 tokens after a 3-token prompt and a 1-token tool result."""
    ids, starts, ends = [1, 2, 3], [], []
    messages = [{"role": "user", "content": "task"}]
    for ran in calls:
        starts.append(len(ids))
        ids += [7, 8]
        ends.append(len(ids))
        ids.append(9)
        messages += [{"role": "assistant", "content": "call"},
                     {"role": "tool", "content": "4" if ran else "Error: bad"}]
    return {"episode_id": episode, "task": "arithmetic", "episode_seed": 0, "input_ids": ids,
            "loss_mask": [0, 0, 0] + [1, 1, 0] * len(calls),
            "engine_logprobs": [0.0] * len(ids), "segment_starts": starts,
            "segment_ends": ends, "segment_rewards": [0.5] * len(calls), "reward": 0.5 * len(calls),
            "termination": termination, "truncated": False, "aborted": False,
            "success": success, "messages": json.dumps(messages), "metrics": "{}",
            "reply_valid": list(calls),
            "tool_calls": len(calls), "tool_errors": calls.count(False), "user_turns": 0,
            "assistant_turns": len(calls), "tokenization_check": "identical", "images": [],
            "image_starts": []}


def test_conversations_are_read_by_the_same_metrics() -> None:
    """Two whole episodes, 3 replies and 1: rewards per reply, length in replies, a reply valid
    when its tool calls ran; the tool-call keys and the tokenization check count them."""
    samples = samples_from_episodes([_conversation("a", [True, False, True], success=True),
                                     _conversation("b", [True])])
    m = batch.sample_metrics(samples)
    assert m["turns"] == 4 and m["episodes_ended"] == 2 and m["successes"] == 1
    assert m["success_rate"] == 0.5 and m["episode_length"] == 2.0
    assert m["mean_reward"] == 0.5 and m["valid_action_ratio"] == 0.75
    assert m["tool_calls_per_episode"] == 2.0 and m["tool_call_validity"] == 0.75
    assert m["termination/done"] == 2 and m["tokenization/identical"] == 2
    assert m["response_tokens"] == 2.0 and not any(k.startswith("action_mix/") for k in m)


def test_one_key_set_for_every_protocol() -> None:
    """Env turns and conversations log the same keys (the action mix apart), so ranks reduce the
    same arrays and the report reads one set; what a protocol has nothing to count for is NaN,
    and the tokenization check is counted only where conversations are."""
    turns = rollout_metrics([_row(3, success=True, ended=True)])
    chat = batch.sample_metrics(samples_from_episodes([_conversation("a", [True])]))
    assert set(chat) - set(turns) == set(batch.TOKENIZATION_KEYS)
    assert sorted(batch.sample_totals([])) == sorted(rollout_totals([_row(0)]))
    assert all(math.isnan(turns[k]) for k in ("tool_calls_per_episode", "tool_call_validity",
                                              "mean_user_turns"))
    no_calls = batch.sample_metrics(samples_from_episodes([_conversation("b", [])]))
    assert math.isnan(no_calls["tool_call_validity"]) and no_calls["tool_calls_per_episode"] == 0


def test_a_record_that_did_not_count_its_calls_gives_no_tool_figures() -> None:
    """A slime Sample cannot say which inserted tokens were tool results or failed calls: its
    record leaves the counts out, and the tool-call keys stay NaN instead of a made-up 1.0."""
    record = {**_conversation("s", [True, True], success=True),
              "tool_calls": None, "tool_errors": None, "user_turns": None}
    m = batch.sample_metrics(samples_from_episodes([record]))
    assert m["turns"] == 2 and m["episodes_ended"] == 1 and m["success_rate"] == 1.0
    assert all(math.isnan(m[k]) for k in ("tool_calls_per_episode", "tool_call_validity",
                                          "mean_user_turns"))


def test_an_env_episodes_row_is_read_from_its_samples() -> None:
    """An episode of three turns (one invalid, then a success): its episodes.parquet row from
    its samples alone; the env's reward apart from the penalised return."""
    episode = {"env_name": "babyai", "task": "goto", "episode_id": "e1", "episode_seed": 7}
    rows = [{**_row(0), **episode}, {**_row(1, valid=False, reward=-0.1), **episode},
            {**_row(2, success=True, ended=True, reward=0.9), **episode, "termination": "success"}]
    row = batch.episode_row(samples_from_turns(rows))
    assert (row["env_name"], row["task"], row["episode_id"], row["episode_seed"]) == (
        "babyai", "goto", "e1", 7)
    assert (row["length"], row["valid_actions"], row["valid_action_ratio"]) == (3, 2, 2 / 3)
    assert math.isclose(row["return"], 0.8) and math.isclose(row["env_return"], 0.9)
    assert row["success"] and row["terminated"] and not row["truncated"]
    assert (row["aborted"], row["termination"]) == (False, "success")
