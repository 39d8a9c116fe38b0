"""Sizes that several params make together, checked against `longturn/params/limits.py`.

Why: each count can be sane alone while their product cannot run (64 envs × 10,000 turns ×
130k-token rows). The error names every key of the product, its value and the bound, so the user
sees which ones to lower. Called by `Params`' validator: every stage refuses such a file before
any work.
"""

from __future__ import annotations

import math
from typing import Any

from longturn.params.estimator import Collection
from longturn.params.limits import CONTEXT_TOKENS, FORWARD_TOKENS, HELD_TOKENS, Limit

Params = Any  # a longturn.params.config.Params; not imported, since config imports this module

Factor = tuple[str, int]  # a key (or a sum of keys) and its value


def row_positions(p: Params) -> Factor:
    """The most positions one sample row can take: the budget of what a reply is given plus the
    reply, the prompt's and the reply's of the action protocol, the conversation's of chat."""
    if p.rollout.protocol == "chat":
        return "rollout.chat.max_tokens", p.rollout.chat.max_tokens
    return ("prompt.max_prompt_tokens + engine.sampling.max_new_tokens",
            p.prompt.max_prompt_tokens + p.engine.sampling.max_new_tokens)


def iteration_rows(p: Params) -> list[Factor] | None:
    """The factors of one iteration's rows per rank (None: episodes end by the env's own limit,
    unknown here). A conversation is one row with the whole episode as context, a row per reply
    with a window; with a critic, an agent's calls and the built-in rollout's windowed replies
    come in fixed-turn batches of n_envs × turns_per_env."""
    r = p.rollout
    if p.collection is Collection.FIXED_TURNS:
        return [("rollout.n_envs", r.n_envs), ("rollout.turns_per_env", r.turns_per_env)]
    if r.protocol == "chat":
        if p.history_window is None:  # the whole episode as context
            return [("rollout.n_envs", r.n_envs)]
        return [("rollout.n_envs", r.n_envs),
                ("rollout.chat.max_assistant_turns", r.chat.max_assistant_turns)]
    if p.env.max_turns is None:
        return None
    return [("rollout.n_envs", r.n_envs), ("env.max_turns", p.env.max_turns)]


def _factor(key: str, value: int, in_product: bool) -> str:
    return f"({key}) ({value:,})" if in_product and " + " in key else f"{key} ({value:,})"


def over(factors: list[Factor], limit: Limit) -> str | None:
    """'a (2) × b (3) = 6 is over 5: why' when the product exceeds the limit."""
    size = math.prod(value for _, value in factors)
    if size <= limit.value:
        return None
    named = " × ".join(_factor(key, value, len(factors) > 1) for key, value in factors)
    product = f" = {size:,}" if len(factors) > 1 else ""
    return f"{named}{product} is over {limit.value:,}: {limit.why}"


def size_problem(p: Params) -> str | None:
    """The first product of params that no run can hold, as one sentence; None when all fit."""
    row = row_positions(p)
    checks: list[tuple[list[Factor], Limit]] = []
    if p.rollout.protocol == "action":  # chat's budget is bounded by its own key
        checks.append(([row], CONTEXT_TOKENS))
    checks += [([("engine.batch_size", p.engine.batch_size), row], FORWARD_TOKENS),
               ([("ppo.micro_batch_size", p.ppo.micro_batch_size), row], FORWARD_TOKENS)]
    rows = iteration_rows(p)
    if rows is not None:
        held = rows + [row]
        if p.algo.estimator.has_critic:  # the critic warm-up keeps every batch it collects
            held.append(("warmup.batches", p.warmup.batches))
        checks.append((held, HELD_TOKENS))
    for factors, limit in checks:
        found = over(factors, limit)
        if found:
            return found
    return None
