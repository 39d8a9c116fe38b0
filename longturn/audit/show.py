"""`show EPISODE_ID RUN_DIR`: an episode's turns as the model saw them, with what training made of
each: prompt, THINK, ACTION, the executed action, reward, value, advantage, return."""

from __future__ import annotations

from typing import Any

import pandas as pd

from longturn.audit.output import Output
from longturn.audit.reasons import FLAG_COLUMNS, turn_reasons
from longturn.audit.run_files import Run, read_turns
from longturn.audit.sequences import is_sequence_run, show_sequence_episode
from longturn.errors import UserError
from longturn.reply_format import parse_reply

REQUIRED = ("episode_id", "turn", "prompt_text", "response_text", "action", "action_valid",
            "reward", *FLAG_COLUMNS)
OPTIONAL = ("iteration", "step", "task", "raw_action", "action_failure", "env_reward",
            "values", "advantages", "returns", "next_value", "finish_reason", "history_dropped",
            "termination")


class EpisodeNotFound(UserError):
    """No turn of the run carries the asked episode id."""


def split_reply(text: str) -> tuple[str, str]:
    """(THINK text, ACTION text) of a reply, split as the action parser splits it."""
    reply = parse_reply(text)
    return reply.think, (reply.action_tail or "").strip()


def _first(values: Any) -> float | None:
    """Entry 0 of a per-token list (V(state), A and return at the first response token)."""
    if values is None or len(values) == 0:
        return None
    return float(values[0])


def _number(value: Any) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.4f}"


def turn_record(row: dict[str, Any]) -> dict[str, Any]:
    think, action_text = split_reply(row["response_text"] or "")
    return {
        "iteration": row["iteration"], "rank": row["rank"], "step": row["step"],
        "turn": row["turn"], "prompt": row["prompt_text"], "response": row["response_text"],
        "think": think, "action_text": action_text, "action": row["action"],
        "action_valid": bool(row["action_valid"]), "action_failure": row["action_failure"],
        "reward": row["reward"], "env_reward": row["env_reward"],
        "value": _first(row["values"]), "advantage": _first(row["advantages"]),
        "return": _first(row["returns"]), "next_value": row["next_value"],
        "ended_by": row["reason"], "finish_reason": row["finish_reason"],
        "history_dropped": row["history_dropped"],
    }


def _render(turn: dict[str, Any], with_prompt: bool) -> str:
    where = " · ".join(f"{k} {turn[k]}" for k in ("iteration", "rank", "step")
                       if turn[k] is not None and not pd.isna(turn[k]))
    valid = "valid" if turn["action_valid"] else f"invalid ({turn['action_failure'] or '?'})"
    lines = [f"── turn {turn['turn']} ({where}) " + "─" * 20]
    if with_prompt:
        lines += ["PROMPT:", turn["prompt"] or ""]
    reply = turn["response"] or ""
    if "ACTION:" in reply or "THINK:" in reply:
        lines += [f"THINK: {turn['think']}", f"ACTION: {turn['action_text']}"]
    else:
        lines += [f"REPLY (no THINK:/ACTION:): {reply}"]
    lines.append(f"executed: {turn['action']} ({valid}) · reward {_number(turn['reward'])} "
                 f"(env {_number(turn['env_reward'])}) · {turn['ended_by']}")
    if turn["value"] is not None:  # scored turns only (evaluation turns have no critic)
        lines += [f"V(s) {_number(turn['value'])} · advantage {_number(turn['advantage'])} · "
                  f"return {_number(turn['return'])} · next value "
                  f"{_number(turn['next_value'])} (first response token)"]
    return "\n".join(lines)


def show_episode(run: Run, episode_id: str, with_prompt: bool = True,
                 turn: int | None = None, frames_dir: str | None = None) -> Output:
    if is_sequence_run(run):  # one row per episode: its conversation, reply by reply
        return show_sequence_episode(run, episode_id, with_prompt, turn, frames_dir)
    if frames_dir is not None:
        raise UserError("--frames: turn-mode files keep no image observations (sequence mode "
                        "with a vision-language model does)")
    frame = read_turns(run, REQUIRED, OPTIONAL, filters=[("episode_id", "==", episode_id)])
    if frame.empty:
        raise EpisodeNotFound(f"{run.root}: no turns of episode '{episode_id}' (list them with "
                              "`longturn audit episodes`)")
    frame["reason"] = turn_reasons(frame)
    frame = frame.sort_values(["turn"], kind="stable")
    head = (f"episode {episode_id} · task {frame['task'].iloc[0]} · {len(frame)} turn(s) stored · "
            f"return {frame['reward'].sum():.4f} · {frame['reason'].iloc[-1]}")
    if turn is not None:
        frame = frame[frame["turn"] == turn]
        if frame.empty:
            raise EpisodeNotFound(f"{run.root}: episode '{episode_id}' has no turn {turn}")
    turns = [turn_record(r) for r in frame.to_dict(orient="records")]
    text = "\n".join([head, *(_render(t, with_prompt) for t in turns)])
    return Output(text, {"episode_id": episode_id, "turns": turns})
