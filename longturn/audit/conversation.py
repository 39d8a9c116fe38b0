"""`show` on a chat-protocol episode: its stored conversation message by message, each reply with
the reward credited after it and what training made of its first token.

An episode's replies sit in one sample (a packed whole episode) or in one sample each (a history
window, an agent's calls, with fixed turns spread over iterations): every one is shown, wherever it
sits, with the conversation (`messages`) of the episode's last sample that stores one. Replies are
matched to its assistant messages from the end: the conversation ends with the episode's last
reply, and the prompt's few-shot examples are assistant messages too. An agent's conversation is
the one its last call sent, which may leave out what earlier calls replied (an agent may drop or
summarise history), and an episode still running has stored none yet: such a reply is shown on
its own, so `show` lists the replies `episodes` and `summary` count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from longturn.audit.frames import write_frames
from longturn.audit.output import Output
from longturn.audit.reply_blocks import (int_or_none, number, render_message, render_unmatched,
                                         reply_records, value_or_none)
from longturn.errors import UserError


class ReplyNotFound(UserError):
    """The episode has no reply of the asked index."""


def _call_text(call: dict[str, Any]) -> str:
    """An OpenAI-style tool call as `→ name(arguments)`."""
    function = call.get("function") or {}
    return f"→ {function.get('name')}({function.get('arguments') or ''})"


def message_text(message: dict[str, Any]) -> str:
    """What a message says: its content (JSON where it is not a string), then the tool calls
    an OpenAI client keeps beside it (an agent's reply that calls a tool)."""
    content = message.get("content")
    text = content if isinstance(content, str) else "" if content is None else json.dumps(content)
    calls = [_call_text(c) for c in message.get("tool_calls") or []]
    return "\n".join([t for t in (text, *calls) if t])


def conversation_messages(text: str | None, turns: list[int]) -> list[dict[str, Any]]:
    """The stored conversation, each message with its `reply`: the turn of the episode's reply
    it holds (the last assistant messages, matched from the end), or None."""
    messages = [{"index": i, "role": m.get("role"), "name": m.get("name"),
                 "content": message_text(m), "reply": None}
                for i, m in enumerate(json.loads(text or "[]"))]
    assistant = [m for m in messages if m["role"] == "assistant"]
    n = min(len(assistant), len(turns))
    for message, turn in zip(assistant[len(assistant) - n:], turns[len(turns) - n:]):
        message["reply"] = turn
    return messages


def _frames(episode: pd.DataFrame, own_samples: bool,
            frames_dir: str | Path | None) -> tuple[int, list[Path]]:
    """How many image observations the episode's prompts hold, and the PNGs written: a packed
    sample's as `<episode>-<k>.png`, each reply's own window's as `<episode>-t<turn>-<k>.png`."""
    episode_id = episode["episode_id"].iloc[0]
    count, written = 0, []
    for row in episode.drop_duplicates("sample").to_dict(orient="records"):
        images = row["images"] if row["images"] is not None else []
        count += len(images)
        if frames_dir is not None and len(images):
            stem = f"{episode_id}-t{row['turn']}" if own_samples else episode_id
            written += write_frames(images, stem, frames_dir)
    return count, written


def _header(episode: pd.DataFrame, every: list[dict[str, Any]], kept: pd.Series | None,
            unmatched: list[int]) -> dict[str, Any]:
    """The episode as a whole: where it was played, how it ended (its last reply), the counts
    its conversation keeps (None while none is stored)."""
    first, last = episode.iloc[0], episode.iloc[-1]
    return {
        "episode_id": first["episode_id"], "task": first["task"],
        "episode_seed": int_or_none(first["episode_seed"]),
        "iteration": int_or_none(first["iteration"]),
        "iterations": sorted({r["iteration"] for r in every if r["iteration"] is not None}),
        "rank": int(first["rank"]), "samples": int(episode["sample"].nunique()),
        "termination": last["termination"], "truncated": bool(last["truncated"]),
        "reward": sum(r["reward"] or 0.0 for r in every), "success": bool(last["success"]),
        **{c: None if kept is None else int_or_none(kept[c]) for c in ("tool_calls",
                                                                        "tool_errors")},
        "tokenization_check": None if kept is None else kept["tokenization_check"],
        "bootstrap_value": value_or_none(last["next_value"]),
        "prompt_tokens": len(first["prompt_ids"]) if first["prompt_ids"] is not None else 0,
        "sampled_tokens": sum(r["tokens"] for r in every), "not_in_conversation": unmatched,
    }


def _head_lines(h: dict[str, Any], replies: int, stored: bool) -> list[str]:
    iterations = h["iterations"]
    # `-` where the episode's record did not count tool calls (one still running, a slime Sample's)
    calls = ("-" if h["tool_calls"] is None
             else f"{h['tool_calls']} ({h['tool_errors'] or 0} error(s))")
    span = (f"iterations {iterations[0]}..{iterations[-1]}" if len(iterations) > 1
            else f"iteration {h['iteration']}")
    lines = [
        f"episode {h['episode_id']} · task {h['task']} · seed {h['episode_seed']} · {span} · "
        f"rank {h['rank']}",
        f"termination {h['termination']}" + (" (truncated)" if h["truncated"] else "")
        + f" · reward {number(h['reward'])} · success {'yes' if h['success'] else 'no'} · "
        f"{replies} replies"
        + (f" in {h['samples']} samples (one per reply)" if h["samples"] > 1 else ""),
        f"tool calls {calls} · "
        f"tokenization check {h['tokenization_check'] or '-'} · {h['prompt_tokens']} prompt "
        f"tokens · {h['sampled_tokens']} sampled"
        + ("" if h["bootstrap_value"] is None else
           f" · bootstrap value {number(h['bootstrap_value'])}"),
    ]
    if h["not_in_conversation"]:
        lines.append(f"{len(h['not_in_conversation'])} reply(ies) not in the stored "
                     "conversation: " + ("the conversation its last sample stores left them out"
                                         if stored else "none is stored yet (the episode goes "
                                                        "on past these files)"))
    return lines


def show_conversation(episode: pd.DataFrame, where: str, with_prompt: bool = True,
                      turn: int | None = None, frames_dir: str | Path | None = None) -> Output:
    """Every row (reply, audit/replies.py) of one episode, with its stored conversation.
    `with_prompt` False drops the messages before the first reply (the system prompt can be
    long); `turn` K keeps reply K with the messages since the reply before it and those answering
    it (tool results, user feedback). `frames_dir`: its images."""
    episode = episode.sort_values("turn", kind="stable")
    own_samples = episode["sample"].nunique() > 1  # a window's or an agent's: a sample per reply
    stored = episode[episode["messages"].notna()]
    kept = stored.iloc[-1] if len(stored) else None
    every = reply_records(episode)
    by_turn = {r["reply"]: r for r in every}
    messages = conversation_messages(None if kept is None else kept["messages"], list(by_turn))
    at = {m["reply"]: m["index"] for m in messages if m["reply"] is not None}
    unmatched = [r for r in every if r["reply"] not in at]
    not_in_conversation = [r["reply"] for r in unmatched]  # the episode's, before `turn` picks
    shown = [m for m in messages if with_prompt or m["index"] >= min(at.values(), default=0)]
    replies = every
    if turn is not None:
        if turn not in by_turn:
            span = f"{every[0]['reply']}..{every[-1]['reply']}"
            raise ReplyNotFound(f"{where}: episode '{episode['episode_id'].iloc[0]}' has no "
                                f"reply {turn} ({len(every)} replies: {span})")
        after, until = at.get(turn - 1, -1), at.get(turn + 1, len(messages))
        shown = [m for m in shown if after < m["index"] < until] if turn in at else []
        replies = [by_turn[turn]]
        unmatched = [r for r in unmatched if r["reply"] == turn]
    header = _header(episode, every, kept, not_in_conversation)
    head = _head_lines(header, len(every), kept is not None)
    images, written = _frames(episode, own_samples, frames_dir)
    if images:
        head.append(f"{images} image observation(s)" + (
            f" written to {frames_dir}" if written else " (--frames DIR writes them as PNG)"))
    text = "\n".join([*head, *(render_unmatched(r, own_samples) for r in unmatched),
                      *(render_message(m, by_turn, own_samples) for m in shown)])
    return Output(text, {**header, "replies": replies, "messages": shown, "images": images,
                         "frames": [str(p) for p in written]})
