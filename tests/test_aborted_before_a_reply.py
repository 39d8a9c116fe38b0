"""An agent that fails before its first call: its episode is counted as aborted with its own
reason (not as a token-budget ending, not in the success rate), trains nothing, and an iteration
in which every episode is like that skips its update instead of stopping the run."""

from __future__ import annotations

import json

from longturn.rollout.sample_metrics import episode_row, sample_metrics
from longturn.rollout.samples import samples_from_episodes
from longturn.run.evaluation import summarise
from longturn.run.training import _trains


def record(termination: str | None, aborted: bool, calls: int) -> dict:
    """An agent rollout's record with `calls` replies of two tokens after a 3-token prompt."""
    ids, starts, ends = [1, 2, 3], [], []
    for _ in range(calls):
        starts.append(len(ids))
        ids += [7, 8]
        ends.append(len(ids))
    return {"episode_id": f"e{calls}{aborted}", "task": "arithmetic", "episode_seed": 0,
            "input_ids": ids, "loss_mask": [0, 0, 0] + [1, 1] * calls,
            "engine_logprobs": [0.0] * len(ids), "segment_starts": starts, "segment_ends": ends,
            "segment_rewards": [0.0] * calls, "reply_valid": [True] * calls, "reward": 0.0,
            "termination": termination,
            "truncated": False, "aborted": aborted, "success": False,
            "messages": json.dumps([]), "metrics": json.dumps({}), "tool_calls": 0,
            "tool_errors": 0, "user_turns": 0, "assistant_turns": calls,
            "tokenization_check": "skipped", "images": [], "image_starts": []}


def test_an_agent_error_before_any_call_is_an_aborted_ending_that_trains_nothing():
    records = [record("agent_error", True, 0), record("done", False, 2)]
    samples = samples_from_episodes(records)
    failed = samples[0]
    assert [r["termination"] for r in failed["replies"]] == ["agent_error"]
    assert failed["replies"][0]["aborted"] and failed["loss_mask"] == [0]
    assert not _trains(failed) and _trains(samples[1])
    m = sample_metrics(samples)
    assert m["termination/agent_error"] == 1 and m["termination/token_budget"] == 0
    assert m["episodes_ended"] == 2 and m["episodes_aborted"] == 1 and m["success_rate"] == 0.0
    # as an evaluation sums it up: one episode row from each episode's samples
    s = summarise([episode_row([sample]) for sample in samples], samples)
    assert s["aborted_episodes"] == 1 and s["completed_episodes"] == 1
    assert s["termination/agent_error"] == 1 and s["mean_length"] == 2


def test_an_aborted_reply_trains_nothing():
    sample = samples_from_episodes([record("timeout", True, 2)])[0]
    assert all(r["aborted"] for r in sample["replies"]) and not _trains(sample)


def test_a_built_in_episode_with_no_room_for_a_reply_keeps_no_reply():
    [sample] = samples_from_episodes([record("token_budget", False, 0)])
    assert sample["replies"] == []
    assert sample_metrics([sample])["termination/token_budget"] == 1
