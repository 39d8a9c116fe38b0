"""The report's sections that differ with the chat protocol (`rollout.protocol: chat`): an
episode is one token sequence of replies, tool results and user turns, so there is no action mix
and no THINK / ACTION split; what tells how the policy behaves is replies, tool calls and whether
they ran, and how the tokenization check went."""

from __future__ import annotations

import pandas as pd

from longturn.report.training import PHASE_KEYS, first_last, numeric

# what every training run of the chat protocol logs (the critic's keys only with a critic)
CONVERSATION_TRAIN_KEYS = [
    "episodes_ended", "successes", "success_rate", "mean_reward", "mean_assistant_turns",
    "tool_calls_per_episode", "mean_tokens", "model_token_fraction", "kl_mean", "policy_loss",
    "value_loss", "explained_variance", "clip_fraction", "approx_kl", "entropy", "lr_actor",
    "lr_critic", "epochs_run", "tokens_per_s", "turns_per_s", "seconds_per_iteration",
    *PHASE_KEYS,
]
OUTCOMES_PREFIX = "tokenization/"
# the eval table's two per-episode columns, named for what they hold in conversations: an
# episode's length is its number of replies, its valid-action ratio the share of its tool calls
# that ran (run/conversation_evaluation.py)
CONVERSATION_EVAL_LABELS = ("mean replies", "valid tool-call ratio")


def behaviour_reading(df: pd.DataFrame) -> list[str]:
    """First vs last iteration of replies, tool calls and their validity, and the tokenization
    check's outcomes over the whole run."""
    lines = []
    for key, label in (("mean_assistant_turns", "replies per episode"),
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
