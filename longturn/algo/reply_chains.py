"""The replies of samples (schema v2, docs/design.md §4) flattened into turns, the unit every
advantage estimator is defined on, so window-N samples (one reply each) and packed samples (a
whole episode each) run the same estimator code:
- a sample with a slot (`env_index`) is linked to the samples before and after it by the
  TurnGrid (same slot and iteration, next step, same episode);
- a packed sample (no slot) gets a slot of its own: its replies form their own chain, reply k at
  step k, and the step discount applies across the context between them (tool results, user
  turns).

`sample_advantages` runs the estimators from a file's own columns, so scoring
(algo/sample_scoring.py) and the audit compute advantages and returns by the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from longturn.algo.gae import GAEParams, gae_for_table
from longturn.algo.group_advantages import GroupParams, turn_advantages
from longturn.algo.turn_grid import TurnGrid

Columns = Mapping[str, Sequence[Any]]
# what advantages and returns are computed from: a sample file's own columns
ADVANTAGE_INPUTS = ("values", "token_rewards", "loss_mask", "replies", "env_index", "episode_id",
                    "iteration", "group_id")


@dataclass(frozen=True)
class ReplySpan:
    """Reply `reply` of row `sample`: its sampled tokens are response[start:end]."""

    sample: int
    reply: int
    start: int
    end: int
    last: bool  # the sample's last reply


def reply_spans(replies: Sequence[Sequence[Mapping[str, Any]] | None]) -> list[ReplySpan]:
    """Every reply of every row, rows in order, replies in order (a row without any: none)."""
    out = []
    for i, row in enumerate(replies):
        row = row or []
        out += [ReplySpan(i, k, int(r["start"]), int(r["end"]), k == len(row) - 1)
                for k, r in enumerate(row)]
    return out


def is_packed(env_index: Any) -> bool:
    """A sample without a slot holds a whole episode: its replies chain among themselves."""
    return env_index is None


def turn_columns(columns: Columns, spans: Sequence[ReplySpan]) -> dict[str, list[Any]]:
    """The ordering columns of `gae_for_table` / TurnGrid, one entry per reply. A packed row's
    slot is -(row + 1) (slots are >= 0), so no two packed rows, nor a packed row and a
    slotted one, ever share a chain."""
    out: dict[str, list[Any]] = {k: [] for k in ("env_index", "step", "episode_id", "iteration",
                                                 "terminated", "aborted", "segment_end")}
    for span in spans:
        reply = columns["replies"][span.sample][span.reply]
        slot = columns["env_index"][span.sample]
        packed = is_packed(slot)
        out["env_index"].append(-(span.sample + 1) if packed else int(slot))
        out["step"].append(span.reply if packed else int(reply["step"]))
        out["episode_id"].append(columns["episode_id"][span.sample])
        out["iteration"].append(int(columns["iteration"][span.sample] or 0))
        for flag in ("terminated", "aborted", "segment_end"):
            out[flag].append(bool(reply.get(flag)))
    return out


def grid_next_values(turns: Mapping[str, Sequence[Any]], spans: Sequence[ReplySpan],
                     first_values: Sequence[float], boot: Mapping[int, float]) -> np.ndarray:
    """The value after each reply (docs/design.md §4): 0 if terminated or aborted; the next
    reply's first value when the episode goes on in this batch (its successor in the grid, or
    the next reply of a packed row); else the bootstrap of the reply's row (`boot`, by row:
    a segment end, a time limit, a packed episode cut short); the successor's first value when
    a segment end has no bootstrap."""
    succ = TurnGrid.build(turns["env_index"], turns["step"], turns["episode_id"],
                          turns["iteration"]).next_row
    out = np.zeros(len(spans), dtype=np.float32)
    for j, span in enumerate(spans):
        if turns["aborted"][j] or turns["terminated"][j]:
            continue
        if span.last and span.sample in boot and (succ[j] < 0 or turns["segment_end"][j]):
            out[j] = boot[span.sample]
        elif succ[j] >= 0:
            out[j] = first_values[succ[j]]
        else:
            raise ValueError(f"sample {span.sample} reply {span.reply} (env "
                             f"{turns['env_index'][j]}, step {turns['step'][j]}): the episode "
                             "goes on but neither its next turn nor bootstrap_prompt_ids is here")
    return out


def stored_next_value(env_index: Any, span: ReplySpan, value: float,
                      boot: Mapping[int, float]) -> float | None:
    """What a reply's `next_value` column holds: for a slotted row the value GAE uses (§4, as
    turn rows always had it); for a packed row only a bootstrap, on its last reply (null
    otherwise), since the rest follows from its own values (`resolved_next_values`)."""
    if not is_packed(env_index):
        return float(value)
    return float(boot[span.sample]) if span.last and span.sample in boot else None


def resolved_next_values(columns: Columns, spans: Sequence[ReplySpan]) -> list[float]:
    """The value after each reply as GAE reads it from a file: the stored `next_value`; where
    null (a packed row), the first value of the row's next reply, or 0 after its last."""
    out = []
    for j, span in enumerate(spans):
        stored = columns["replies"][span.sample][span.reply].get("next_value")
        if stored is not None:
            out.append(float(stored))
        elif not span.last:
            out.append(float(columns["values"][span.sample][spans[j + 1].start]))
        else:
            out.append(0.0)
    return out


def reply_rewards(token_rewards: Sequence[Sequence[float]], spans: Sequence[ReplySpan]
                  ) -> list[float]:
    """Each reply's reward for a group estimator: its row's token rewards from the previous
    reply's end (0 for the first) to its own end, so the KL terms of its tokens and the reward
    credited on its last one."""
    out = []
    for j, span in enumerate(spans):
        row = np.asarray(token_rewards[span.sample], dtype=np.float64)
        prev = 0 if span.reply == 0 else spans[j - 1].end
        out.append(float(np.sum(row[prev:span.end])))
    return out


def sample_advantages(columns: Columns, gae_params: GAEParams | None,
                      group_params: GroupParams | None
                      ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-token advantages and returns of each row (float64, as long as its response, 0 outside
    its replies) from `ADVANTAGE_INPUTS`: GAE over the replies flattened into turns when
    `gae_params`, else the group estimator with each reply a turn."""
    adv = [np.zeros(len(m or ())) for m in columns["loss_mask"]]
    ret = [np.zeros(len(m or ())) for m in columns["loss_mask"]]
    spans = reply_spans(columns["replies"])
    if not spans:
        return adv, ret
    _check_token_rewards(columns, spans)
    if gae_params is not None:
        per_reply = _reply_gae(columns, spans, gae_params)
    elif group_params is not None:
        per_reply = _reply_group(columns, spans, group_params)
    else:
        raise ValueError("sample_advantages needs GAE or group parameters")
    for span, a, r in zip(spans, *per_reply):
        adv[span.sample][span.start:span.end] = a
        ret[span.sample][span.start:span.end] = r
    return adv, ret


def _check_token_rewards(columns: Columns, spans: list[ReplySpan]) -> None:
    for i in sorted({span.sample for span in spans}):
        rewards, mask = columns["token_rewards"][i], columns["loss_mask"][i]
        if rewards is None or len(rewards) != len(mask):
            raise ValueError(f"sample {i} (episode {columns['episode_id'][i]}): token_rewards "
                             f"missing or not as long as its {len(mask)} response tokens")


def _reply_gae(columns: Columns, spans: list[ReplySpan],
               params: GAEParams) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Dual-discount GAE with each reply a turn (algo/gae.py gae_for_table)."""
    missing = sorted({s.sample for s in spans if columns["values"][s.sample] is None})
    if missing:
        raise ValueError(f"samples {missing} have no values: GAE needs a critic's (a critic-free "
                         "file is read with its group estimator)")
    table = turn_columns(columns, spans)
    table["values"] = [columns["values"][s.sample][s.start:s.end] for s in spans]
    table["token_rewards"] = [columns["token_rewards"][s.sample][s.start:s.end] for s in spans]
    table["next_value"] = resolved_next_values(columns, spans)
    return gae_for_table(table, params)


def _reply_group(columns: Columns, spans: list[ReplySpan],
                 params: GroupParams) -> tuple[np.ndarray, np.ndarray]:
    """GRPO / GiGPO with each reply a turn: each reply's advantage and discounted return, which
    every token of the reply gets."""
    replies = [columns["replies"][s.sample][s.reply] for s in spans]
    observation = [r.get("observation") for r in replies]
    if params.estimator == "gigpo" and None in observation:
        at = spans[observation.index(None)]
        raise ValueError(f"sample {at.sample} reply {at.reply}: no observation, GiGPO's anchor "
                         "state")
    return turn_advantages(
        [columns["group_id"][s.sample] for s in spans],
        [columns["episode_id"][s.sample] for s in spans], [int(r["turn"]) for r in replies],
        reply_rewards(columns["token_rewards"], spans), observation,
        [bool(r.get("aborted")) for r in replies], params)
