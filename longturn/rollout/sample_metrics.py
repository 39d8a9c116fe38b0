"""What a batch of samples says, whatever played it: one metric set for every protocol and
context, summed over ranks before dividing, and one episodes.parquet row per ended episode. The
rules (which episodes count, what is per reply and what per episode, when a reply is valid, which
ratios are NaN) are docs/design.md §5e. Frames are counted by `image_starts`, one per frame, so a
caller may leave the PNG bytes out of the samples it passes.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import numpy as np

from longturn.envs import termination as env_endings
from longturn.rollout import conversation as chat_endings
from longturn.stats import wilson_interval

Sample = dict[str, Any]
SumOverRanks = Callable[[np.ndarray], np.ndarray]

PREFIX = env_endings.PREFIX
REASONS = tuple(dict.fromkeys(env_endings.REASONS + chat_endings.REASONS))
ABORTED = tuple(dict.fromkeys(env_endings.ABORTED + (chat_endings.AGENT_ERROR,
                                                     chat_endings.AGENT_TIMEOUT)))
TERMINATION_KEYS = tuple(PREFIX + r for r in REASONS)
OUTCOMES = ("identical", "same_text", "strippable", "skipped")
TOKENIZATION_KEYS = tuple(f"tokenization/{o}" for o in OUTCOMES)
ACTION_MIX_PREFIX = "action_mix/"
# totals, logged as counts; every other key is a ratio of two of them
_COUNTS = ("turns", "episodes_ended", "episodes_aborted", "successes", *TERMINATION_KEYS,
           *TOKENIZATION_KEYS)


def _replies(samples: Iterable[Sample]) -> list[dict[str, Any]]:
    return [reply for sample in samples for reply in sample["replies"] or ()]


def _ended(reply: dict[str, Any]) -> bool:
    return bool(reply.get("termination") or reply["terminated"] or reply["truncated"])


def ends_episode(sample: Sample) -> bool:
    """The sample holds its episode's last reply (a whole episode always does; of a history
    window's samples, one a reply each, the last), or no reply at all."""
    replies = sample["replies"]
    return not replies or _ended(replies[-1])


def ending(sample: Sample) -> str:
    """Why the episode that `sample` ends ended; a sample with no reply never had room for one
    (its first messages filled the token budget)."""
    replies = sample["replies"]
    if not replies:
        return chat_endings.TOKEN_BUDGET
    return env_endings.reason_of(replies[-1]) or ""


def _reasons(samples: list[Sample]) -> list[str]:
    """One reason per ended episode: its last reply's, a reply-less sample's, a failed reset's."""
    out = [env_endings.reason_of(r) or "" for r in _replies(samples) if _ended(r)]
    out += [chat_endings.TOKEN_BUDGET for s in samples if not s["replies"]]
    return out + [a for s in samples for a in s.get("aborted_resets") or ()]


def episode_row(samples: list[Sample]) -> dict[str, Any]:
    """One episodes.parquet row from the samples of one ended episode, whichever protocol
    played it and whatever its context. Its length is its replies (a conversation's own count
    where it has one: an agent that failed before its first call has a reply of no token), its
    return the sum of their rewards (the env's alone in `env_return`, where an env gave it)."""
    first, replies = samples[0], _replies(samples)
    last = replies[-1] if replies else {}
    valid = [bool(v) for v in _known(r["action_valid"] for r in replies)]
    env_rewards = _known(r["env_reward"] for r in replies)
    total = float(sum(r["reward"] or 0.0 for r in replies))
    turns = samples[-1].get("assistant_turns")
    return {
        "run_id": first.get("run_id"), "policy_version": first.get("policy_version"),
        "env_name": first.get("env_name") or "chat", "task": first["task"],
        "episode_id": first["episode_id"], "episode_seed": first["episode_seed"],
        "success": any(bool(r["success"]) for r in replies), "return": total,
        "env_return": float(sum(env_rewards)) if env_rewards else total,
        "length": len(replies) if turns is None else int(turns),
        "valid_actions": sum(valid),
        "valid_action_ratio": sum(valid) / len(valid) if valid else 1.0,
        "terminated": bool(last.get("terminated")) and not last.get("aborted"),
        "truncated": bool(last.get("truncated")) if replies else True,
        "aborted": bool(last.get("aborted")), "termination": ending(samples[-1]),
    }


def unstarted_row(extra: dict[str, Any], env_name: str | None, task: str, episode_id: str,
                  seed: int, reason: str) -> dict[str, Any]:
    """The episode row of a job (an evaluation's, its run_id and policy_version in `extra`)
    whose start failed: aborted, of no reply, ended for `reason` (env_error or timeout). Both
    protocols write the same row."""
    return {"run_id": extra.get("run_id"), "policy_version": extra.get("policy_version"),
            "env_name": env_name or "chat", "task": task, "episode_id": episode_id,
            "episode_seed": seed, "success": False, "return": 0.0, "env_return": 0.0,
            "length": 0, "valid_actions": 0, "valid_action_ratio": 0.0, "terminated": False,
            "truncated": False, "aborted": True, "termination": reason}


def count_endings(reasons: Iterable[str | None]) -> dict[str, int]:
    """`termination/<reason>` → how many, every reason of both protocols present (zeros
    included, so every rank and every file has the same keys), None skipped."""
    counts = dict.fromkeys(REASONS, 0)
    for reason in reasons:
        if reason is not None:
            counts[reason] = counts.get(reason, 0) + 1
    return {PREFIX + reason: n for reason, n in counts.items()}


def _known(values: Iterable[Any]) -> list[Any]:
    return [v for v in values if v is not None]


def sample_totals(samples: list[Sample]) -> dict[str, tuple[float, float]]:
    """(numerator, denominator) of every metric, the same keys on every rank, so ranks can be
    summed before dividing."""
    replies = _replies(samples)
    completed = [r for r in replies if _ended(r) and not r["aborted"]]
    reasons = _reasons(samples)
    aborted = sum(r in ABORTED for r in reasons)
    ended = float(len(reasons))
    n = float(len(replies))
    wins = float(sum(bool(r["success"]) for r in completed))
    valid = [bool(v) for v in _known(r["action_valid"] for r in replies)]
    env_rewards = _known(r["env_reward"] for r in replies)
    finishes = _known(r["finish_reason"] for r in replies)
    held = [s for s in samples if s.get("assistant_turns") is not None]  # conversations
    # those that counted their calls (a slime Sample cannot: serve/slime_rollout.py)
    counted = [s for s in held if s.get("tool_calls") is not None]
    calls = float(sum(int(s["tool_calls"]) for s in counted))
    tokens = float(sum(len(s["prompt_ids"]) + len(s["response_ids"]) for s in samples))
    checks = [s.get("tokenization_check") for s in samples
              if ends_episode(s) and s.get("assistant_turns") is not None]
    per_episode = ended if counted else 0.0  # conversation counts: NaN where none counted
    totals = {
        "turns": (n, 1.0), "episodes_ended": (ended, 1.0), "episodes_aborted": (aborted, 1.0),
        "successes": (wins, 1.0), "success_rate": (wins, float(len(completed))),
        "episode_length": (float(sum(r["turn"] + 1 for r in completed)), float(len(completed))),
        "mean_reward": (float(sum(r["reward"] or 0.0 for r in replies)), n),
        "mean_env_reward": (float(sum(env_rewards)), float(len(env_rewards))),
        "valid_action_ratio": (float(sum(valid)), float(len(valid))),
        "response_tokens": (float(sum(r["end"] - r["start"] for r in replies)), n),
        "finish_length_ratio": (float(finishes.count("length")), float(len(finishes))),
        "tool_calls_per_episode": (calls, per_episode),
        "tool_call_validity": (calls - sum(int(s["tool_errors"] or 0) for s in counted), calls),
        "mean_user_turns": (float(sum(int(s["user_turns"] or 0) for s in counted)), per_episode),
        "mean_tokens": (tokens, ended),
        "model_token_fraction": (float(sum(sum(s["loss_mask"]) for s in samples)), tokens),
        "images_per_episode": (float(sum(len(s.get("image_starts") or ()) for s in samples)),
                               ended),
        "conversations_ended": (float(len(checks)), 1.0),
    }
    counted = count_endings(reasons)
    totals.update({key: (float(counted[key]), 1.0) for key in TERMINATION_KEYS})
    totals.update({f"tokenization/{o}": (float(sum((c or "skipped") == o for c in checks)), 1.0)
                   for o in OUTCOMES})
    return totals


def sample_metrics(samples: list[Sample], action_names: Iterable[str] = (),
                   sum_over_ranks: SumOverRanks | None = None) -> dict[str, float]:
    """Every metric of the samples (every rank's with `sum_over_ranks`, an all-reduce of an
    array), the success rate's Wilson 95 % interval, and the action mix over `action_names`."""
    totals = sample_totals(samples)
    keys = sorted(totals)
    values = np.array([totals[k] for k in keys], dtype=np.float64)
    if sum_over_ranks is not None:
        values = sum_over_ranks(values)
    reduced = dict(zip(keys, values.tolist()))
    out: dict[str, float] = {}
    for key, (numerator, denominator) in reduced.items():
        if key in _COUNTS:
            out[key] = float(numerator)
        else:
            out[key] = numerator / denominator if denominator > 0 else float("nan")
    if not out.pop("conversations_ended"):  # the check counts only conversations
        for key in TOKENIZATION_KEYS:
            del out[key]
    wins, completed = reduced["success_rate"]
    out["success_ci95_low"], out["success_ci95_high"] = wilson_interval(int(wins), int(completed))
    out.update(action_mix(samples, action_names, sum_over_ranks))
    return out


def action_mix(samples: list[Sample], actions: Iterable[str],
               sum_over_ranks: SumOverRanks | None = None) -> dict[str, float]:
    """Share of the replies parsed into an action that executed each one (every rank's when
    `sum_over_ranks` is given): a policy collapsing onto one action shows here first. Keys are
    `action_mix/<action>` with spaces as underscores; actions outside `actions` (a plug-in env's
    free text) are counted under `action_mix/other`. No key when no action is named (chat on
    tasks that play no env: their players name none)."""
    names = list(dict.fromkeys(actions))
    if not names:
        return {}
    names.append("other")
    counts = np.zeros(len(names), dtype=np.float64)
    index = {name: i for i, name in enumerate(names)}
    for reply in _replies(samples):
        if reply["action"] is not None:
            counts[index.get(reply["action"], len(names) - 1)] += 1
    if sum_over_ranks is not None:
        counts = sum_over_ranks(counts)
    total = counts.sum()
    return {ACTION_MIX_PREFIX + name.replace(" ", "_"): float(c / total) if total else 0.0
            for name, c in zip(names, counts) if name != "other" or c > 0}


def json_safe(metrics: dict[str, Any]) -> dict[str, Any]:
    """The same metrics with NaN (a ratio with nothing to count) as None: strict JSON."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in metrics.items()}
