"""The audit on sequence-mode files (docs/design.md §4b): one row per episode, not per turn.

Such a file says `mode: sequence` in its metadata, and its columns are not the turn columns, so
each subcommand either has a sequence reading here (`summary`, `show`, `gae`; `sql` needs none:
DuckDB reads any Parquet) or refuses the file with one line naming the commands that do work,
instead of a "column 'turn' is missing" that would send the user looking for a damaged file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from longturn.audit.output import Output, table
from longturn.audit.run_files import Run, read_file, require_columns
from longturn.errors import UserError
from longturn.trajectories import is_sequence_file
from longturn.rollout.sequence_episode import REASONS
from longturn.rollout.sequence_metrics import OUTCOMES, sequence_metrics

SEQUENCE_COMMANDS = ("summary", "show", "gae", "sql")


class TurnFilesOnly(UserError):
    """A turn-mode subcommand was given sequence-mode files."""


class SequenceEpisodeNotFound(UserError):
    """No episode row of the run carries the asked episode id (or the asked reply)."""


def is_sequence_run(run: Run) -> bool:
    """A run is one mode throughout (the training params fix it), so its first file decides."""
    return bool(run.files) and is_sequence_file(run.files[0].path)


def refuse(run: Run, command: str) -> None:
    """Raise TurnFilesOnly when `command` (which reads turn columns) is given sequence files."""
    if is_sequence_run(run):
        raise TurnFilesOnly(
            f"{run.files[0].path}: a sequence-mode file (one row per episode); `{command}` reads "
            f"turn-mode files; on sequence files use {', '.join(SEQUENCE_COMMANDS)}")


# ── gae ──────────────────────────────────────────────────────────────────────────────────────

def gae_columns(metadata: dict[str, str]) -> tuple[str, ...]:
    """What audit_sequence_file must find in a file: the advantage inputs its estimator reads
    (values and the bootstrap for GAE, the group for critic-free) and the stored results."""
    from longturn.algo.group_advantages import CRITIC_FREE

    algo = json.loads(metadata.get("algo", "{}"))
    estimator = ("group_id",) if algo.get("advantage") in CRITIC_FREE else (
        "values", "bootstrap_value")
    return ("input_ids", "segment_starts", "segment_ends", "token_rewards", "truncated",
            "episode_id", *estimator, "advantages", "returns")


# ── summary ──────────────────────────────────────────────────────────────────────────────────

SUMMARY_COLUMNS = ("iteration", "task", "episode_id", "reward", "success", "termination",
                   "assistant_turns", "user_turns", "tool_calls", "tool_errors", "input_ids",
                   "loss_mask")


def read_episodes(run: Run, required: tuple[str, ...], optional: tuple[str, ...] = (),
                  filters: list | None = None) -> list[dict[str, Any]]:
    """The episode rows of every file as Python records (lists stay lists, nulls None), each
    with the file's rank; an optional column a file lacks comes back None."""
    rows = []
    for turn_file in run.files:
        names = require_columns(turn_file.path, required).names
        present = [*required, *(c for c in optional if c in names)]
        for row in read_file(turn_file.path, present, filters).to_pylist():
            rows.append({**dict.fromkeys(optional), **row, "rank": turn_file.rank})
    return rows


def _stats(records: list[dict[str, Any]]) -> dict[str, Any]:
    """longturn.rollout.sequence_metrics over these episodes (what training logs per iteration), with
    short names for the tables."""
    m = sequence_metrics(records)
    return {"episodes": m["episodes"], "successes": m["successes"],
            "success_rate": m["success_rate"], "mean_reward": m["mean_reward"],
            "mean_replies": m["mean_assistant_turns"],
            "tool_calls_per_episode": m["tool_calls_per_episode"],
            "tool_call_validity": m["tool_call_validity"],
            **{r: m[f"termination/{r}"] for r in REASONS},
            **{f"tokenization_{o}": m[f"tokenization/{o}"] for o in OUTCOMES}}


def _by(records: list[dict[str, Any]], key: str) -> pd.DataFrame:
    values = sorted({r[key] for r in records})
    rows = [{key: v, **_stats([r for r in records if r[key] == v])} for v in values]
    return pd.DataFrame(rows).drop(columns=[f"tokenization_{o}" for o in OUTCOMES])


def summarise_sequences(run: Run) -> Output:
    records = read_episodes(run, SUMMARY_COLUMNS, ("tokenization_check",))
    for r in records:
        r["iteration"] = int(r["iteration"] or 0)
    overall = _stats(records)
    tokenization = {o: overall.pop(f"tokenization_{o}") for o in OUTCOMES}
    iterations = sorted({r["iteration"] for r in records})
    by_iteration, by_task = _by(records, "iteration"), _by(records, "task")
    data = {"run": str(run.root), "kind": run.kind, "mode": "sequence", "files": len(run.files),
            "iterations": iterations, "ranks": sorted({int(r["rank"]) for r in records}),
            "tasks": sorted({str(r["task"]) for r in records}), "overall": overall,
            "tokenization_check": tokenization, "per_iteration": by_iteration,
            "per_task": by_task}
    span = f" ({iterations[0]}..{iterations[-1]})" if iterations else ""
    validity = overall["tool_call_validity"]
    text = "\n".join([
        f"run: {run.root} ({run.kind}, sequence mode, {len(run.files)} file(s))",
        f"iterations: {len(iterations)}{span}   ranks: {len(data['ranks'])}   "
        f"tasks: {', '.join(data['tasks'])}",
        f"episodes: {overall['episodes']}   replies per episode: {overall['mean_replies']:.2f}",
        f"success: {overall['successes']}/{overall['episodes']} "
        f"({overall['success_rate']:.3f})   mean reward: {overall['mean_reward']:.4f}",
        f"tool calls per episode: {overall['tool_calls_per_episode']:.2f}   tool-call validity: "
        + ("- (no calls)" if pd.isna(validity) else f"{validity:.3f}"),
        "termination: " + " · ".join(f"{r} {overall[r]}" for r in REASONS),
        "tokenization check: " + " · ".join(f"{o} {n}" for o, n in tokenization.items()),
        "", "per iteration:", table(by_iteration), "", "per task:", table(by_task),
    ])
    return Output(text, data)


# ── show ─────────────────────────────────────────────────────────────────────────────────────

SHOW_REQUIRED = ("episode_id", "task", "segment_starts", "segment_ends", "segment_rewards",
                 "reward", "success", "termination", "messages")
SHOW_OPTIONAL = ("episode_seed", "iteration", "truncated", "tool_calls", "tool_errors",
                 "tokenization_check", "loss_mask", "values", "advantages", "returns",
                 "bootstrap_value", "images")


def _at(values: list[float] | None, index: int) -> float | None:
    """Entry `index` of a per-token list; None where the file holds none (critic-free values,
    evaluation files)."""
    return None if values is None or index >= len(values) else float(values[index])


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _replies(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Each assistant segment: its tokens, the reward credited after it, and what training
    made of its first token."""
    out = []
    for k, (start, end) in enumerate(zip(row["segment_starts"] or [], row["segment_ends"] or [])):
        out.append({"reply": k, "start": start, "end": end, "tokens": end - start,
                    "reward": _at(row["segment_rewards"], k), "value": _at(row["values"], start),
                    "advantage": _at(row["advantages"], start),
                    "return": _at(row["returns"], start)})
    return out


def _messages(row: dict[str, Any], replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with each reply attached to its assistant message. The replies are the
    last assistant messages: earlier ones belong to the task's prompt (few-shot examples)."""
    messages = [{"index": i, "role": m.get("role"), "name": m.get("name"),
                 "content": m.get("content") if isinstance(m.get("content"), str)
                 else json.dumps(m.get("content")), "reply": None}
                for i, m in enumerate(json.loads(row["messages"] or "[]"))]
    assistant = [m for m in messages if m["role"] == "assistant"]
    for message, reply in zip(assistant[-len(replies):] if replies else [], replies):
        message["reply"] = reply["reply"]
    return messages


def _render(message: dict[str, Any], replies: list[dict[str, Any]]) -> str:
    role = f"{message['role']}" + (f" ({message['name']})" if message["name"] else "")
    if message["reply"] is None:
        return "\n".join([f"── {role} " + "─" * 20, message["content"] or ""])
    r = replies[message["reply"]]
    lines = [f"── {role} · reply {r['reply']} · {r['tokens']} tokens " + "─" * 20,
             message["content"] or "",
             f"reward after it {_number(r['reward'])}"
             + ("" if r["value"] is None else f" · V {_number(r['value'])}")
             + ("" if r["advantage"] is None else f" · advantage {_number(r['advantage'])} · "
                                                  f"return {_number(r['return'])}")
             + (" (first token)" if r["advantage"] is not None or r["value"] is not None else "")]
    return "\n".join(lines)


def show_sequence_episode(run: Run, episode_id: str, with_prompt: bool = True,
                          turn: int | None = None, frames_dir: str | Path | None = None) -> Output:
    """The episode's conversation message by message. `with_prompt` False drops the messages
    before the first reply (the system prompt can be long); `turn` K keeps reply K with the
    messages since the reply before it and those answering it (tool results, user feedback).
    `frames_dir`: write its image observations there as `<episode>-<k>.png`, k in the order
    of the `<image>` lines."""
    rows = read_episodes(run, SHOW_REQUIRED, SHOW_OPTIONAL,
                         filters=[("episode_id", "==", episode_id)])
    if not rows:
        raise SequenceEpisodeNotFound(f"{run.root}: no episode '{episode_id}' (list them with "
                                      "`longturn audit sql \"SELECT episode_id FROM turns\"`)")
    row = rows[0]
    replies = every = _replies(row)
    messages = _messages(row, every)
    at = {m["reply"]: m["index"] for m in messages if m["reply"] is not None}
    first = at.get(0, len(messages))
    shown = [m for m in messages if with_prompt or m["index"] >= first]
    if turn is not None:
        if not 0 <= turn < len(replies):
            raise SequenceEpisodeNotFound(f"{run.root}: episode '{episode_id}' has no reply "
                                          f"{turn} ({len(replies)} replies: 0..{len(replies) - 1})")
        after = at.get(turn - 1, -1)
        until = at.get(turn + 1, len(messages))
        shown = [m for m in shown if after < m["index"] < until]
        replies = [replies[turn]]
    calls, errors = row["tool_calls"] or 0, row["tool_errors"] or 0
    mask = row["loss_mask"] or []
    header = {k: row[k] for k in ("episode_id", "task", "episode_seed", "iteration", "rank",
                                  "termination", "truncated", "reward", "success", "tool_calls",
                                  "tool_errors", "tokenization_check", "bootstrap_value")}
    head = [
        f"episode {episode_id} · task {row['task']} · seed {row['episode_seed']} · iteration "
        f"{row['iteration']} · rank {row['rank']}",
        f"termination {row['termination']}" + (" (truncated)" if row["truncated"] else "")
        + f" · reward {_number(row['reward'])} · success {'yes' if row['success'] else 'no'}"
        f" · {len(every)} replies",
        f"tool calls {calls} ({errors} error(s)) · tokenization check "
        f"{row['tokenization_check'] or '-'} · {len(mask)} tokens ({sum(mask)} sampled)"
        + ("" if row["bootstrap_value"] is None else
           f" · bootstrap value {_number(row['bootstrap_value'])}"),
    ]
    images = row.get("images") or []
    written = _write_frames(images, episode_id, frames_dir) if frames_dir is not None else []
    if images:
        head.append(f"{len(images)} image observation(s)" + (
            f" written to {frames_dir}" if written else " (--frames DIR writes them as PNG)"))
    text = "\n".join([*head, *(_render(m, every) for m in shown)])
    return Output(text, {**header, "tokens": len(mask), "sampled_tokens": int(sum(mask)),
                         "replies": replies, "messages": shown, "images": len(images),
                         "frames": [str(p) for p in written]})


def _write_frames(images: list[bytes], episode_id: str, frames_dir: str | Path) -> list[Path]:
    """The episode's PNG bytes as files, as stored (no re-encoding)."""
    out = Path(frames_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{episode_id}-{k}.png" for k in range(len(images))]
    for path, png in zip(paths, images):
        path.write_bytes(png)
    return paths
