"""How `show` prints a conversation's parts: a message, and a reply with where it sits and what
training made of it (the reward credited after it; V, advantage and return at its first token)."""

from __future__ import annotations

from typing import Any

import pandas as pd


def value_or_none(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def int_or_none(value: Any) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def first_value(values: Any) -> float | None:
    """Entry 0 of a reply's per-token slice; None where the file holds none (critic-free values,
    evaluation files)."""
    return None if values is None or len(values) == 0 else float(values[0])


def number(value: float | None) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.4f}"


def reply_records(episode: pd.DataFrame) -> list[dict[str, Any]]:
    """Each reply of an episode's rows (audit/replies.py): where it sits (iteration, lock-step,
    the tokens of its sample's prompt, its span of the response), the reward credited after it,
    and V, advantage and return at its first token."""
    return [{"reply": int(r["turn"]), "iteration": int_or_none(r["iteration"]),
             "step": int_or_none(r["step"]),
             "prompt_tokens": 0 if r["prompt_ids"] is None else len(r["prompt_ids"]),
             "start": int(r["start"]), "end": int(r["end"]),
             "tokens": int(r["end"]) - int(r["start"]), "reward": value_or_none(r["reward"]),
             "value": first_value(r["values"]), "advantage": first_value(r["advantages"]),
             "return": first_value(r["returns"])}
            for r in episode.to_dict(orient="records")]


def _reply_head(r: dict[str, Any], role: str, own_samples: bool) -> str:
    """A reply's heading; where each reply is a sample of its own (a window, an agent's call),
    its iteration, lock-step and the prompt it was given."""
    where = (f" · iteration {r['iteration']} · step {r['step']} · its prompt "
             f"{r['prompt_tokens']} tokens" if own_samples else "")
    return f"── {role} · reply {r['reply']} · {r['tokens']} tokens{where} " + "─" * 20


def _reply_line(r: dict[str, Any]) -> str:
    scored = r["advantage"] is not None or r["value"] is not None
    return (f"reward after it {number(r['reward'])}"
            + ("" if r["value"] is None else f" · V {number(r['value'])}")
            + ("" if r["advantage"] is None else f" · advantage {number(r['advantage'])} · "
                                                 f"return {number(r['return'])}")
            + (" (first token)" if scored else ""))


def render_message(message: dict[str, Any], replies: dict[int, dict[str, Any]],
                   own_samples: bool) -> str:
    """A message of the stored conversation (conversation_messages), with its reply's numbers."""
    role = f"{message['role']}" + (f" ({message['name']})" if message["name"] else "")
    if message["reply"] is None:
        return "\n".join([f"── {role} " + "─" * 20, message["content"] or ""])
    r = replies[message["reply"]]
    return "\n".join([_reply_head(r, role, own_samples), message["content"] or "",
                      _reply_line(r)])


def render_unmatched(r: dict[str, Any], own_samples: bool) -> str:
    """A reply the stored conversation does not hold: its numbers, no text."""
    return "\n".join([_reply_head(r, "assistant", own_samples),
                      "(its text is not in the stored conversation)", _reply_line(r)])
