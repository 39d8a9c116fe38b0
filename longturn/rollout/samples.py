"""The rollout's conversation records as samples of schema v2 (docs/design.md §4): pure
converters, nothing read or written.

A whole episode (a conversation record, scored or not) becomes one sample holding all its
replies: the context before its first reply is the prompt, everything after is the response, and
every per-token list is cut at that same place, so its values stay where they were. Scored
columns come along when present, null when not. An episode played with a history window (its
record holds each reply's window) becomes one sample per reply instead: what that reply was
given, and what it sampled.
"""

from __future__ import annotations

from typing import Any, Iterable

from longturn.trajectories import REPLY_TYPE, SAMPLE_SCHEMA

Row = dict[str, Any]

# a windowed episode's columns on each of its samples, and its conversation's on the last one
# (a record's columns of the whole episode: rollout/conversation.py `record`)
_WINDOW_ROW_COLUMNS = ("run_id", "policy_version", "iteration", "env_name", "task",
                       "episode_id", "episode_seed", "group_id")
CONVERSATION_COLUMNS = ("assistant_turns", "user_turns", "tool_calls", "tool_errors",
                        "tokenization_check", "messages", "metrics")
# a conversation record's columns that a sample keeps as they are
_EPISODE_COLUMNS = (*_WINDOW_ROW_COLUMNS, "images", "image_starts", *CONVERSATION_COLUMNS)
# a conversation record's per-token lists (as long as input_ids), cut where the response begins
_EPISODE_TOKEN_LISTS = ("engine_logprobs", "old_logprobs", "ref_logprobs", "values",
                        "token_rewards", "advantages", "returns")


def sample_from_episode(record: Row) -> Row:
    """A conversation record (rollout/conversation.py `record()`, with what the collector and
    scoring add) as one sample holding all its replies. An episode with no reply (its first
    messages filled the token budget) keeps its last token as a response with loss mask 0."""
    ids = list(record["input_ids"])
    starts, ends = list(record["segment_starts"]), list(record["segment_ends"])
    if not starts and len(ids) < 2:
        raise ValueError(f"episode {record.get('episode_id')}: {len(ids)} token(s) and no reply: "
                         "not an episode")
    first = starts[0] if starts else len(ids) - 1
    sample = _blank_sample()
    sample.update({name: record.get(name) for name in _EPISODE_COLUMNS})
    sample.update(prompt_ids=ids[:first], response_ids=ids[first:],
                  loss_mask=list(record["loss_mask"][first:]) if starts else [0])
    for name in _EPISODE_TOKEN_LISTS:
        full = record.get(name)
        sample[name] = None if full is None else list(full[first:])
    sample["replies"] = _episode_replies(record, ids, starts, ends, first)
    if not starts and record.get("aborted"):  # an agent that failed before its first call: its
        # ending rides on one reply of no loss token, counted as an aborted step
        sample["replies"] = [{**_blank_reply(), "start": 0, "end": 1, "turn": 0, "step": 0,
                              "reward": 0.0, "terminated": False, "truncated": False,
                              "success": False, "aborted": True, "segment_end": False,
                              "termination": record.get("termination")}]
    return sample


def _episode_replies(record: Row, ids: list[int], starts: list[int], ends: list[int],
                     first: int) -> list[Row]:
    """One reply per segment; how the episode ended goes on the last one. A record that is
    `cut` holds the replies of one fixed-turn batch of an episode that goes on in the next: its
    last reply is a segment end (bootstrapped), not the episode's end."""
    rewards = list(record.get("segment_rewards") or [0.0] * len(starts))
    # why each reply stopped (stop or length), where the rollout recorded it
    finish_reasons = list(record.get("reply_finish_reasons") or [None] * len(starts))
    # whether none of each reply's tool calls failed (None: the record does not say)
    valid = list(record.get("reply_valid") or [None] * len(starts))
    # what an env read each reply as (raw_action, action, action_failure), where one did
    actions = list(record.get("reply_actions") or [None] * len(starts))
    texts = list(record.get("reply_texts") or [None] * len(starts))  # each reply's content
    cut = bool(record.get("cut"))
    replies = []
    for k, (start, end) in enumerate(zip(starts, ends)):
        last = k == len(starts) - 1
        ended = last and not cut
        truncated = bool(record.get("truncated")) and ended
        replies.append({
            **_blank_reply(), "start": start - first, "end": end - first,
            "turn": k + int(record.get("first_turn") or 0), "step": k,
            "reward": float(rewards[k]), "terminated": ended and not truncated,
            "truncated": truncated, "success": bool(record.get("success")) and ended,
            # an agent that raised or hung (serve/agent_rollout.py): no reply of it trains; an env
            # that did on a reply's step: that reply alone (`Conversation.abort`)
            "aborted": bool(record.get("aborted")) and k >= int(record.get("aborted_from") or 0),
            # a fixed-turn batch's last lock-step ends every reply's segment, cut or ended; so does
            # the end of an episode played whole in lock-steps (`ends_segment`)
            "segment_end": last and (cut or bool(record.get("ends_segment"))),
            "termination": record.get("termination") if ended else None,
            "finish_reason": finish_reasons[k], "action_valid": valid[k], **(actions[k] or {}),
            "response_text": texts[k],
            "next_value": record.get("bootstrap_value") if last else None,
            # what the model saw since the previous reply (GiGPO's anchor state), or the state
            # the record names for the reply (an agent's call: what it sent)
            "observation": (record["reply_observations"][k] if record.get("reply_observations")
                            else " ".join(map(str, ids[ends[k - 1] if k else 0:start]))),
        })
    return replies


def _blank_sample() -> Row:
    """Every column of the schema, null: a sample reads the same in memory as from its file."""
    return dict.fromkeys(SAMPLE_SCHEMA.names)


def _blank_reply() -> Row:
    return {field.name: None for field in REPLY_TYPE}


def samples_from_window(record: Row, env_index: int) -> list[Row]:
    """An episode played with a history window (rollout/history_window.py) as one sample per
    reply: its window as the prompt (with the window's frames), its sampled ids as the response.
    The replies of one episode share its slot `env_index` at consecutive lock-steps, so the turn
    grid chains them step after step; the conversation's own columns go on the
    last sample, and a reply that ends a cut-short episode bootstraps from the window a next
    reply would have seen."""
    ids = list(record["input_ids"])
    starts, ends = list(record["segment_starts"]), list(record["segment_ends"])
    pngs = list(record.get("images") or [])
    packed = _episode_replies(record, ids, starts, ends, 0)  # flags on the last, observations
    # the action prompts (an env's episode) say their text and what history they dropped
    texts = record.get("window_texts") or [None] * len(starts)
    dropped = record.get("window_history_dropped") or [None] * len(starts)
    out = []
    for k, (start, end) in enumerate(zip(starts, ends)):
        sample = _blank_sample()
        sample.update({name: record.get(name) for name in _WINDOW_ROW_COLUMNS})
        sample.update(
            env_index=int(env_index), prompt_ids=list(record["window_prompts"][k]),
            prompt_text=texts[k],
            response_ids=ids[start:end], loss_mask=[1] * (end - start),
            engine_logprobs=list(record["engine_logprobs"][start:end]),
            images=[pngs[j] for j in record["window_frames"][k]],
            image_starts=list(record["window_image_starts"][k]),
            replies=[{**packed[k], "start": 0, "end": end - start,
                      "step": int(record["reply_steps"][k]), "history_dropped": dropped[k]}])
        out.append(sample)
    last = out[-1]
    last.update({name: record.get(name) for name in CONVERSATION_COLUMNS})
    if record.get("bootstrap_prompt_ids"):
        last.update(bootstrap_prompt_ids=list(record["bootstrap_prompt_ids"]),
                    bootstrap_images=[pngs[j] for j in record["bootstrap_frames"]],
                    bootstrap_image_starts=list(record["bootstrap_image_starts"]))
    return out


def samples_from_episodes(records: Iterable[Row]) -> list[Row]:
    """Every episode as its samples, in order, one flat list: a packed sample per whole
    episode, a sample per reply of an episode played with a history window. A record's slot is
    its `env_index` (ConversationRun.play sets it), else its place in `records`."""
    out: list[Row] = []
    for position, record in enumerate(records):
        if record.get("window_prompts") and record["segment_starts"]:
            slot = record.get("env_index")
            out += samples_from_window(record, position if slot is None else slot)
        else:
            out.append(sample_from_episode(record))
    return out
