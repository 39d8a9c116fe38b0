"""How the policy replied, in words, whatever the protocol: replies per episode, tool calls and
whether they ran, the share of the sequence the model wrote, the tokenization check, and KL per
token. Each line is written when its metric was logged (rollout/sample_metrics.py leaves out what
a run has nothing to count for: tool calls without conversations)."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from longturn.report.training import SuccessBlock, block_mean, first_last, numeric, span_text

OUTCOMES_PREFIX = "tokenization/"
PER_EPISODE = ("episode_length", "tool_calls_per_episode")  # pooled as success is


def _pooled(df: pd.DataFrame, key: str, blocks: Sequence[SuccessBlock]) -> str | None:
    """`key` over the first and over the last block, with their iterations; None with fewer
    than two blocks or a block that did not log it."""
    if len(blocks) < 2:
        return None
    first, last = block_mean(df, key, blocks[0]), block_mean(df, key, blocks[-1])
    if first is None or last is None:
        return None
    return (f"{first:.2f} ({span_text(blocks[0])}) → {last:.2f} ({span_text(blocks[-1])})")


def replies_reading(df: pd.DataFrame, blocks: Sequence[SuccessBlock] = ()) -> list[str]:
    """Replies and tool calls per episode (pooled over the first and last success blocks when
    there are two or more, else first vs last iteration), the validity of tool calls and the
    share of the sequence the model wrote (first vs last iteration), and the tokenization
    check's outcomes over the whole run."""
    lines = []
    for key, label in (("episode_length", "replies per episode"),
                       ("tool_calls_per_episode", "tool calls per episode"),
                       ("tool_call_validity", "tool calls that did not fail"),
                       ("model_token_fraction", "share of the sequence the model wrote")):
        pooled = _pooled(df, key, blocks) if key in PER_EPISODE else None
        fl = first_last(df, key)
        if pooled:
            lines.append(f"- {label}, over the episodes ended in the first and last success "
                         f"blocks: {pooled}.")
        elif fl:
            lines.append(f"- {label}: {fl[0]:.2f} → {fl[1]:.2f} over {fl[2]} iteration(s).")
        elif key == "tool_call_validity" and "tool_calls_per_episode" in df.columns:
            lines.append("- tool calls that did not fail: no tool call was made.")
    outcomes = {c[len(OUTCOMES_PREFIX):]: int(round(numeric(df, c).sum()))
                for c in df.columns if str(c).startswith(OUTCOMES_PREFIX)}
    if outcomes:
        shown = ", ".join(f"{k} {v}" for k, v in outcomes.items() if v) or "none"
        lines.append(f"- tokenization check over the run's episodes: {shown} (a mismatch stops "
                     "the run under `strict`).")
    return lines


def kl_mean_reading(df: pd.DataFrame) -> list[str]:
    fl = first_last(df, "kl_mean")
    if not fl:
        return []
    return [f"- KL(π‖π_ref) per sampled token: {fl[0]:.4f} → {fl[1]:.4f} over {fl[2]} "
            "iteration(s)."]
