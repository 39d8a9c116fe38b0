"""How the policy replied, in words, whatever the protocol: replies per episode, tool calls and
whether they ran, the share of the sequence the model wrote, the tokenization check, and KL per
token. Each line is written when its metric was logged (rollout/sample_metrics.py leaves out what
a run has nothing to count for: tool calls without conversations)."""

from __future__ import annotations

import pandas as pd

from longturn.report.training import first_last, numeric

OUTCOMES_PREFIX = "tokenization/"


def replies_reading(df: pd.DataFrame) -> list[str]:
    """First vs last iteration of replies, tool calls and their validity, and the tokenization
    check's outcomes over the whole run."""
    lines = []
    for key, label in (("episode_length", "replies per episode"),
                       ("tool_calls_per_episode", "tool calls per episode"),
                       ("tool_call_validity", "tool calls that ran"),
                       ("model_token_fraction", "share of the sequence the model wrote")):
        fl = first_last(df, key)
        if fl:
            lines.append(f"- {label}: {fl[0]:.2f} → {fl[1]:.2f} over {fl[2]} iteration(s).")
        elif key == "tool_call_validity" and "tool_calls_per_episode" in df.columns:
            lines.append("- tool calls that ran: no tool call was made.")
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
