"""What a batch of conversation samples (docs/design.md §4) says: success, reward, replies, tool-call validity,
image observations, why episodes ended and how the tokenization check went; summed over ranks
in training.

A whole episode is one sample; an episode played with a history window is a sample per reply,
its conversation's columns on the last one. Episodes are counted by the samples that end them;
tokens, model tokens and images are summed over every sample (in a window: what the model was
given, reply by reply, so `mean_tokens` is what an episode cost).

Counts are `termination/<reason>` (done, max_assistant_turns, max_user_turns, token_budget,
time_limit) and `tokenization/<outcome>` (identical, same_text, strippable, skipped), every key
present.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from longturn.rollout.conversation import REASONS, TOKEN_BUDGET
from longturn.stats import wilson_interval

OUTCOMES = ("identical", "same_text", "strippable", "skipped")
_SUMS = ("episodes", "successes", "reward", "replies", "assistant_turns", "user_turns",
         "tool_calls", "tool_errors", "tokens", "model_tokens", "images")


def _totals(samples: list[dict[str, Any]]) -> dict[str, float]:
    out = dict.fromkeys(_SUMS, 0.0)
    ends = [s for s in samples if ends_episode(s)]
    out["episodes"] = float(len(ends))
    out["successes"] = float(sum(bool(s["replies"] and s["replies"][-1]["success"])
                                 for s in ends))
    for s in samples:
        replies = s["replies"] or []
        out["reward"] += float(sum(r["reward"] or 0.0 for r in replies))
        out["replies"] += len(replies)
        for key in ("assistant_turns", "user_turns", "tool_calls", "tool_errors"):
            out[key] += int(s[key] or 0)
        out["tokens"] += len(s["prompt_ids"]) + len(s["response_ids"])
        out["model_tokens"] += int(sum(s["loss_mask"]))
        out["images"] += len(s.get("images") or [])
    for reason in REASONS:
        out[f"termination/{reason}"] = float(sum(ending(s) == reason for s in ends))
    for outcome in OUTCOMES:
        out[f"tokenization/{outcome}"] = float(sum((s.get("tokenization_check") or "skipped")
                                                   == outcome for s in ends))
    return out


def ends_episode(sample: dict[str, Any]) -> bool:
    """The sample holds its episode's last reply (a whole episode always does; of a history
    window's samples, one a reply each, the last), or no reply at all."""
    replies = sample["replies"]
    return not replies or replies[-1]["termination"] is not None


def ending(sample: dict[str, Any]) -> str:
    """Why a whole episode ended: its last reply says; an episode with no reply never had room
    for one (its first messages filled the token budget)."""
    replies = sample["replies"]
    return replies[-1]["termination"] if replies else TOKEN_BUDGET


def json_safe(metrics: dict[str, Any]) -> dict[str, Any]:
    """The same metrics with NaN (a ratio with nothing to count) as None: strict JSON."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in metrics.items()}


def conversation_metrics(samples: list[dict[str, Any]],
                     sum_over_ranks: Callable[[np.ndarray], np.ndarray] | None = None
                     ) -> dict[str, Any]:
    """Rates and means over these episodes (every rank's with `sum_over_ranks`), the success
    rate with its Wilson 95 % interval, and the counts. `tool_call_validity` is the share of
    tool calls that ran (not malformed, unknown or failing): NaN when no call was made."""
    totals = _totals(samples)
    keys = sorted(totals)
    values = np.array([totals[k] for k in keys], dtype=np.float64)
    if sum_over_ranks is not None:
        values = sum_over_ranks(values)
    t = dict(zip(keys, values.tolist()))
    n = int(t["episodes"])
    low, high = wilson_interval(int(t["successes"]), n)
    calls = t["tool_calls"]
    per = (lambda key: t[key] / n) if n else (lambda key: float("nan"))
    out: dict[str, Any] = {
        "episodes": n, "successes": int(t["successes"]),
        "success_rate": per("successes"), "success_ci95_low": low, "success_ci95_high": high,
        "mean_reward": per("reward"), "mean_assistant_turns": per("assistant_turns"),
        "mean_user_turns": per("user_turns"), "tool_calls_per_episode": per("tool_calls"),
        "tool_call_validity": (calls - t["tool_errors"]) / calls if calls else float("nan"),
        "mean_tokens": per("tokens"),
        "model_token_fraction": t["model_tokens"] / t["tokens"] if t["tokens"] else float("nan"),
        "images_per_episode": per("images"), "replies": int(t["replies"]),
    }
    out.update({k: int(v) for k, v in t.items() if "/" in k})
    return out
