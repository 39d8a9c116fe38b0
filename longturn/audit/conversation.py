"""`show` on a sample that keeps its conversation (a packed whole episode: `messages`): the
messages one by one, each reply with the reward credited after it and what training made of its
first token. The prompt's few-shot examples are assistant messages too, so the replies are the
last assistant messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from longturn.audit.frames import write_frames
from longturn.audit.output import Output
from longturn.errors import UserError


class ReplyNotFound(UserError):
    """The episode has no reply of the asked index."""


def _value(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _first(values: Any) -> float | None:
    """Entry 0 of a reply's per-token slice; None where the file holds none (critic-free values,
    evaluation files)."""
    return None if values is None or len(values) == 0 else float(values[0])


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def reply_records(sample: pd.DataFrame) -> list[dict[str, Any]]:
    """Each reply of one sample's rows: where its tokens sit in the response, the reward credited
    after it, and V, advantage and return at its first token."""
    return [{"reply": int(r["turn"]), "start": int(r["start"]), "end": int(r["end"]),
             "tokens": int(r["end"]) - int(r["start"]), "reward": _value(r["reward"]),
             "value": _first(r["values"]), "advantage": _first(r["advantages"]),
             "return": _first(r["returns"])}
            for r in sample.to_dict(orient="records")]


def _messages(text: str | None, replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with each reply attached to its assistant message."""
    messages = [{"index": i, "role": m.get("role"), "name": m.get("name"),
                 "content": m.get("content") if isinstance(m.get("content"), str)
                 else json.dumps(m.get("content")), "reply": None}
                for i, m in enumerate(json.loads(text or "[]"))]
    assistant = [m for m in messages if m["role"] == "assistant"]
    for message, reply in zip(assistant[-len(replies):] if replies else [], replies):
        message["reply"] = reply["reply"]
    return messages


def _render(message: dict[str, Any], replies: dict[int, dict[str, Any]]) -> str:
    role = f"{message['role']}" + (f" ({message['name']})" if message["name"] else "")
    if message["reply"] is None:
        return "\n".join([f"── {role} " + "─" * 20, message["content"] or ""])
    r = replies[message["reply"]]
    scored = r["advantage"] is not None or r["value"] is not None
    return "\n".join([
        f"── {role} · reply {r['reply']} · {r['tokens']} tokens " + "─" * 20,
        message["content"] or "",
        f"reward after it {_number(r['reward'])}"
        + ("" if r["value"] is None else f" · V {_number(r['value'])}")
        + ("" if r["advantage"] is None else f" · advantage {_number(r['advantage'])} · "
                                             f"return {_number(r['return'])}")
        + (" (first token)" if scored else ""),
    ])


def show_conversation(sample: pd.DataFrame, where: str, with_prompt: bool = True,
                      turn: int | None = None, frames_dir: str | Path | None = None) -> Output:
    """One sample's rows (one per reply, audit/replies.py) as its conversation. `with_prompt`
    False drops the messages before the first reply (the system prompt can be long); `turn` K
    keeps reply K with the messages since the reply before it and those answering it (tool
    results, user feedback). `frames_dir`: its images as `<episode>-<k>.png`."""
    sample = sample.sort_values("turn", kind="stable")
    head_row, last = sample.iloc[0], sample.iloc[-1]
    episode_id = head_row["episode_id"]
    every = reply_records(sample)
    by_turn = {r["reply"]: r for r in every}
    messages = _messages(head_row["messages"], every)
    at = {m["reply"]: m["index"] for m in messages if m["reply"] is not None}
    shown = [m for m in messages if with_prompt or m["index"] >= at.get(every[0]["reply"], 0)]
    replies = every
    if turn is not None:
        if turn not in by_turn:
            span = f"{every[0]['reply']}..{every[-1]['reply']}"
            raise ReplyNotFound(f"{where}: episode '{episode_id}' has no reply {turn} "
                                f"({len(every)} replies: {span})")
        after, until = at.get(turn - 1, -1), at.get(turn + 1, len(messages))
        shown = [m for m in shown if after < m["index"] < until]
        replies = [by_turn[turn]]
    header = {
        "episode_id": episode_id, "task": head_row["task"],
        "episode_seed": _int(head_row["episode_seed"]), "iteration": _int(head_row["iteration"]),
        "rank": int(head_row["rank"]), "termination": last["termination"],
        "truncated": bool(last["truncated"]), "reward": sum(r["reward"] or 0.0 for r in every),
        "success": bool(last["success"]), "tool_calls": _int(head_row["tool_calls"]),
        "tool_errors": _int(head_row["tool_errors"]),
        "tokenization_check": head_row["tokenization_check"],
        "bootstrap_value": _value(last["next_value"]),
    }
    prompt = len(head_row["prompt_ids"]) if head_row["prompt_ids"] is not None else 0
    sampled = sum(r["tokens"] for r in every)
    head = [
        f"episode {episode_id} · task {header['task']} · seed {header['episode_seed']} · "
        f"iteration {header['iteration']} · rank {header['rank']}",
        f"termination {header['termination']}" + (" (truncated)" if header["truncated"] else "")
        + f" · reward {_number(header['reward'])} · success "
        f"{'yes' if header['success'] else 'no'} · {len(every)} replies",
        f"tool calls {header['tool_calls'] or 0} ({header['tool_errors'] or 0} error(s)) · "
        f"tokenization check {header['tokenization_check'] or '-'} · {prompt} prompt tokens · "
        f"{sampled} sampled"
        + ("" if header["bootstrap_value"] is None else
           f" · bootstrap value {_number(header['bootstrap_value'])}"),
    ]
    images = head_row["images"] if head_row["images"] is not None else []
    written = write_frames(images, episode_id, frames_dir) if frames_dir is not None else []
    if len(images):
        head.append(f"{len(images)} image observation(s)" + (
            f" written to {frames_dir}" if written else " (--frames DIR writes them as PNG)"))
    text = "\n".join([*head, *(_render(m, by_turn) for m in shown)])
    return Output(text, {**header, "prompt_tokens": prompt, "sampled_tokens": sampled,
                         "replies": replies, "messages": shown, "images": len(images),
                         "frames": [str(p) for p in written]})


def _int(value: Any) -> int | None:
    return None if value is None or pd.isna(value) else int(value)
