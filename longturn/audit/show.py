"""`show EPISODE_ID RUN_DIR`: every reply of an episode as the model saw it, with what training
made of each, read from all the samples that hold the episode. A conversation (a packed whole
episode, a windowed one, an agent's calls) is shown message by message (audit/conversation.py);
an env's episode (the action protocol) turn by turn: prompt, THINK, ACTION, the executed action,
reward, value, advantage, return."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from longturn.audit.conversation import show_conversation
from longturn.audit.frames import write_frames
from longturn.audit.output import Output
from longturn.audit.reasons import FLAG_COLUMNS, turn_reasons
from longturn.audit.replies import read_replies
from longturn.audit.reply_blocks import first_value, number
from longturn.audit.run_files import Run
from longturn.errors import UserError
from longturn.reply_format import parse_reply

COLUMNS = ("episode_id", "turn", "prompt_text", "response_text", "action", "action_valid",
           "reward", "iteration", "step", "task", "raw_action", "action_failure", "env_reward",
           "values", "advantages", "returns", "next_value", "finish_reason", "history_dropped",
           "termination", "start", "end", "episode_seed", "prompt_ids", "messages", "images",
           "tool_calls", "tool_errors", "tokenization_check", *FLAG_COLUMNS)


class EpisodeNotFound(UserError):
    """No sample of the run carries the asked episode id (or the asked turn)."""


def split_reply(text: str) -> tuple[str, str]:
    """(THINK text, ACTION text) of a reply, split as the action parser splits it."""
    reply = parse_reply(text)
    return reply.think, (reply.action_tail or "").strip()


def turn_record(row: dict[str, Any]) -> dict[str, Any]:
    think, action_text = split_reply(row["response_text"] or "")
    images = row["images"] if row["images"] is not None else []
    return {
        "iteration": row["iteration"], "rank": row["rank"], "step": row["step"],
        "turn": row["turn"], "prompt": row["prompt_text"], "response": row["response_text"],
        "think": think, "action_text": action_text, "action": row["action"],
        "action_valid": bool(row["action_valid"]), "action_failure": row["action_failure"],
        "reward": row["reward"], "env_reward": row["env_reward"],
        "value": first_value(row["values"]), "advantage": first_value(row["advantages"]),
        "return": first_value(row["returns"]), "next_value": row["next_value"],
        "ended_by": row["reason"], "finish_reason": row["finish_reason"],
        "history_dropped": row["history_dropped"], "images": len(images),
    }


def _render(turn: dict[str, Any], with_prompt: bool) -> str:
    where = " · ".join(f"{k} {turn[k]}" for k in ("iteration", "rank", "step")
                       if not pd.isna(turn[k]))
    valid = "valid" if turn["action_valid"] else f"invalid ({turn['action_failure'] or '?'})"
    lines = [f"── turn {turn['turn']} ({where}) " + "─" * 20]
    if with_prompt:
        lines += ["PROMPT:", turn["prompt"] or ""]
        if turn["images"]:
            lines.append(f"({turn['images']} image observation(s) in this prompt)")
    reply = turn["response"] or ""
    if "ACTION:" in reply or "THINK:" in reply:
        lines += [f"THINK: {turn['think']}", f"ACTION: {turn['action_text']}"]
    else:
        lines += [f"REPLY (no THINK:/ACTION:): {reply}"]
    lines.append(f"executed: {turn['action']} ({valid}) · reward {number(turn['reward'])} "
                 f"(env {number(turn['env_reward'])}) · {turn['ended_by']}")
    if turn["value"] is not None:  # scored turns only (evaluation turns have no critic)
        lines += [f"V(s) {number(turn['value'])} · advantage {number(turn['advantage'])} · "
                  f"return {number(turn['return'])} · next value "
                  f"{number(turn['next_value'])} (first response token)"]
    return "\n".join(lines)


def _show_turns(frame: pd.DataFrame, where: str, with_prompt: bool, turn: int | None,
                frames_dir: str | Path | None) -> Output:
    episode_id = frame["episode_id"].iloc[0]
    frame = frame.sort_values(["iteration", "turn"], kind="stable")
    head = (f"episode {episode_id} · task {frame['task'].iloc[0]} · {len(frame)} turn(s) "
            f"stored · return {frame['reward'].sum():.4f} · {frame['reason'].iloc[-1]}")
    if turn is not None:
        frame = frame[frame["turn"] == turn]
        if frame.empty:
            raise EpisodeNotFound(f"{where}: episode '{episode_id}' has no turn {turn}")
    rows = frame.to_dict(orient="records")
    turns = [turn_record(r) for r in rows]
    written: list[Path] = []
    if frames_dir is not None:  # each turn's prompt holds the frames of its history window
        for row in rows:
            if row["images"] is not None:
                written += write_frames(row["images"], f"{episode_id}-t{row['turn']}", frames_dir)
    text = "\n".join([head, *(_render(t, with_prompt) for t in turns)]
                     + ([f"wrote {len(written)} frame(s) to {frames_dir}"] if written else []))
    return Output(text, {"episode_id": episode_id, "turns": turns,
                         "frames": [str(p) for p in written]})


def _is_conversation(frame: pd.DataFrame) -> bool:
    """A chat-protocol episode: it stores its conversation (`messages`), or its prompts carry no
    text of their own (a packed episode's, a chat window's or an agent call's context is in the
    conversation of the episode's last sample, not written while the episode goes on; a window
    of an env's episode writes its action prompt's text, and reads turn by turn)."""
    return bool(frame["messages"].notna().any() or frame["prompt_text"].isna().all())


def show_episode(run: Run, episode_id: str, with_prompt: bool = True,
                 turn: int | None = None, frames_dir: str | Path | None = None) -> Output:
    """Every reply of the episode, in whichever samples it sits: the turns of an env's, or the
    replies of a conversation (one packed sample, or a sample per windowed reply or agent
    call) with its stored messages."""
    frame = read_replies(run, COLUMNS, filters=[("episode_id", "==", episode_id)])
    if frame.empty:
        raise EpisodeNotFound(f"{run.root}: no replies of episode '{episode_id}' (list them "
                              "with `longturn audit episodes`)")
    frame["reason"] = turn_reasons(frame)
    if _is_conversation(frame):
        return show_conversation(frame, str(run.root), with_prompt, turn, frames_dir)
    return _show_turns(frame, str(run.root), with_prompt, turn, frames_dir)
