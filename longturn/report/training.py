"""What the training metrics say, in words: pooled success, where the time goes, the action mix,
KL drift, critic warm-up. Pure functions of the step-indexed metrics DataFrame (no plotting)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from longturn.envs.termination import PREFIX
from longturn.report.evaluation import REASON_LABELS
from longturn.report.value_fit import explained_variance_reading, numeric
from longturn.stats import wilson_interval

PHASE_KEYS = ["seconds_rollout", "seconds_scoring", "seconds_update", "seconds_sync",
              "seconds_checkpoint"]
ACTION_PREFIX = "action_mix/"
# One action taking this share of the last iteration's turns reads as a collapsed policy.
COLLAPSE_SHARE = 0.8
# KL is in nats per token. Below this gap between the two rises, "faster" is not worth a flag.
MIN_KL_GAP = 0.01


# --------------------------------------------------------------------------- pooled success

@dataclass(frozen=True)
class SuccessBlock:
    """Consecutive iterations pooled until enough episodes ended to say something."""

    first_iteration: int
    last_iteration: int
    iteration: float  # mean of the block's iterations that ended an episode: where it is drawn
    episodes: int
    successes: int
    rate: float
    low: float
    high: float


def ended_counts(df: pd.DataFrame) -> pd.DataFrame:
    """Per iteration with an ended episode: `episodes` and `successes` (from `successes` when
    logged, else round(success_rate · episodes_ended), the only record of older runs). Aborted
    episodes (`episodes_aborted`, when logged) are not counted: success is over the others."""
    ended = numeric(df, "episodes_ended")
    ended = (ended - numeric(df, "episodes_aborted").reindex(ended.index).fillna(0.0)).round()
    ended = ended[ended > 0].astype(int)
    from_rate = (numeric(df, "success_rate").reindex(ended.index) * ended).round()
    wins = numeric(df, "successes").reindex(ended.index).fillna(from_rate)
    keep = wins.notna()
    wins = wins[keep].clip(lower=0, upper=ended[keep]).astype(int)
    return pd.DataFrame({"episodes": ended[keep], "successes": wins}).sort_index()


def _block(counts: pd.DataFrame) -> SuccessBlock:
    n, wins = int(counts["episodes"].sum()), int(counts["successes"].sum())
    low, high = wilson_interval(wins, n)
    iterations = counts.index.to_numpy()
    return SuccessBlock(int(iterations[0]), int(iterations[-1]), float(iterations.mean()), n, wins,
                        wins / n, low, high)


def pool_success_blocks(df: pd.DataFrame, target_blocks: int = 10,
                        min_episodes: int = 10) -> list[SuccessBlock]:
    """Pool consecutive iterations into about `target_blocks` blocks of at least `min_episodes`
    ended episodes each, a short tail merged into the block before it: one iteration that ended
    one episode would otherwise plot as a 0 → 1 swing. A run that ended fewer than
    `min_episodes` in all is one block; a run without `episodes_ended` gives none. Iterations
    that ended no episode carry no weight and do not open or close a block."""
    counts = ended_counts(df)
    if counts.empty:
        return []
    size = max(min_episodes, math.ceil(counts["episodes"].sum() / target_blocks))
    groups, start, running = [], 0, 0
    for i, n in enumerate(counts["episodes"]):
        running += n
        if running >= size:
            groups.append((start, i + 1))
            start, running = i + 1, 0
    if start < len(counts):
        if groups and running < min_episodes:
            groups[-1] = (groups[-1][0], len(counts))
        else:
            groups.append((start, len(counts)))
    return [_block(counts.iloc[a:b]) for a, b in groups]


def block_mean(df: pd.DataFrame, key: str, block: SuccessBlock) -> float | None:
    """`key`'s per-iteration values over the block's iterations, weighted by the episodes each
    ended: a per-episode metric (episode length, tool calls) read the way success is pooled, so
    the iterations that end only the short episodes (the first, in fixed-turn batches) do not
    decide it. None when no iteration of the block logged it."""
    counts = ended_counts(df)["episodes"]
    values = numeric(df, key)
    span = [i for i in counts.index if block.first_iteration <= i <= block.last_iteration
            and i in values.index]
    weight = float(sum(counts[i] for i in span))
    return float(sum(values[i] * counts[i] for i in span)) / weight if weight else None


def span_text(b: SuccessBlock) -> str:
    return (f"iteration {b.first_iteration}" if b.first_iteration == b.last_iteration
            else f"iterations {b.first_iteration}–{b.last_iteration}")


def _block_text(b: SuccessBlock) -> str:
    return f"{span_text(b)}: {b.successes}/{b.episodes} = {b.rate:.2f} [{b.low:.2f}, {b.high:.2f}]"


def success_reading(blocks: list[SuccessBlock], label: str = "success") -> list[str]:
    """First vs last block with Wilson intervals; overlapping intervals are not read as change.
    `label` names the figure at the start of the line."""
    if not blocks:
        return []
    total = sum(b.episodes for b in blocks)
    if len(blocks) == 1:
        return [f"- {label} (pooled): {_block_text(blocks[0])}; only one block "
                f"({total} ended episodes), so no trend can be read."]
    first, last = blocks[0], blocks[-1]
    if first.low <= last.high and last.low <= first.high:
        verdict = "the 95% intervals overlap: no clear change at this sample size."
    else:
        verdict = (f"the 95% intervals do not overlap: success went "
                   f"{'up' if last.rate > first.rate else 'down'}.")
    smallest = min(b.episodes for b in blocks)
    return [f"- {label}, pooled into {len(blocks)} blocks ({total} ended episodes, at least "
            f"{smallest} per block): {_block_text(first)} → {_block_text(last)}; {verdict}"]


# --------------------------------------------------------------------------- first vs last

def first_last(df: pd.DataFrame, key: str) -> tuple[float, float, int] | None:
    s = numeric(df, key)
    return (float(s.iloc[0]), float(s.iloc[-1]), len(s)) if len(s) else None


def training_reading(df: pd.DataFrame, blocks: list[SuccessBlock]) -> list[str]:
    """First vs last value of the headline curves; success only when it could not be pooled."""
    lines = []
    keys = ["mean_reward", "valid_action_ratio"]
    if not blocks:  # no episode counts to pool: the per-iteration rate is all there is
        keys.insert(0, "success_rate")
    for key in keys:
        fl = first_last(df, key)
        if fl:
            which = " in which an episode ended" if key == "success_rate" else ""
            lines.append(f"- {key.replace('_', ' ')}: {fl[0]:.3f} → {fl[1]:.3f} over {fl[2]} "
                         f"iteration(s){which}.")
    return lines + explained_variance_reading(df)


# --------------------------------------------------------------------------- time and actions

def timing_reading(df: pd.DataFrame) -> list[str]:
    """Median seconds per phase and its share of all phase seconds of the run. A phase that runs
    only in some iterations (checkpoint) is a median over those, and says in how many."""
    phases = {k: numeric(df, k) for k in PHASE_KEYS}
    phases = {k: s for k, s in phases.items() if len(s)}
    total = sum(float(s.sum()) for s in phases.values())
    if not phases or total <= 0:
        return []
    iterations = len(set().union(*(s.index for s in phases.values())))

    def part(key: str, s: pd.Series) -> str:
        some = f", in {len(s)} of {iterations} iterations" if len(s) < iterations else ""
        return f"{key.removeprefix('seconds_')} {s.median():.1f} s ({s.sum() / total:.0%}{some})"

    parts = [part(k, s) for k, s in phases.items()]
    line = "Median seconds per iteration by phase (share of all phase time): " + ", ".join(parts)
    tps = numeric(df, "turns_per_s")
    return [line + (f"; median {tps.median():.1f} turns/s." if len(tps) else ".")]


def action_mix(df: pd.DataFrame) -> pd.DataFrame:
    """The `action_mix/<name>` columns renamed to the action (underscores back to spaces)."""
    keys = [c for c in df.columns if c.startswith(ACTION_PREFIX) and len(numeric(df, c))]
    mix = df[keys].apply(pd.to_numeric, errors="coerce").dropna(how="all")
    return mix.rename(columns=lambda c: c.removeprefix(ACTION_PREFIX).replace("_", " "))


def action_reading(df: pd.DataFrame) -> list[str]:
    """Flags a collapse: one action taking ≥ COLLAPSE_SHARE of the last iteration's turns."""
    mix = action_mix(df)
    if mix.empty:
        return []
    step = mix.index[-1]
    last = mix.iloc[-1].fillna(0.0)
    top, share = str(last.idxmax()), float(last.max())
    if share >= COLLAPSE_SHARE:
        return [f"Action collapse: “{top}” takes {share:.0%} of the turns in the last iteration "
                f"({step}), at or above the {COLLAPSE_SHARE:.0%} flag."]
    return [f"No collapse: “{top}”, the most frequent action, takes {share:.0%} of the turns "
            f"in the last iteration ({step}); the flag is at {COLLAPSE_SHARE:.0%}."]


# --------------------------------------------------------------------------- terminations

def termination_reading(df: pd.DataFrame) -> list[str]:
    """How training episodes ended, and whether the env cost any (aborted: out of the loss)."""
    totals = {reason: int(round(numeric(df, PREFIX + reason).sum()))
              for reason in REASON_LABELS if PREFIX + reason in df.columns}
    if not totals:
        return []
    ended = sum(totals.values())
    parts = ", ".join(f"{REASON_LABELS[r]} {n}" for r, n in totals.items() if n) or "none"
    aborted = sum(totals.get(r, 0) for r in ("env_error", "timeout", "agent_error"))
    iterations = len(set().union(*(numeric(df, PREFIX + r).index for r in totals)))
    line = f"- training: {ended} episodes ended over {iterations} iteration(s): {parts}."
    if aborted:
        worst = numeric(df, "episodes_aborted")
        peak = (f" (at most {int(worst.max())} in one iteration, iteration {int(worst.idxmax())})"
                if len(worst) else "")
        line += (f" {aborted} ({aborted / ended:.0%}) were aborted by the env{peak}: their "
                 "turns are out of the loss and they are not counted as failures; the stage "
                 "log names each failure.")
    else:
        line += " No episode was aborted by the env."
    return [line]


# --------------------------------------------------------------------------- KL and warm-up

def kl_reading(df: pd.DataFrame) -> list[str]:
    """Flags action KL rising faster than think KL (the action-hacking signature)."""
    think, action = first_last(df, "kl_think"), first_last(df, "kl_action")
    if not think or not action or min(think[2], action[2]) < 2:
        return ["Not enough KL points to compare THINK and ACTION drift."]
    d_think, d_action = think[1] - think[0], action[1] - action[0]
    if d_action > 0 and d_action > d_think + MIN_KL_GAP:
        verdict = "ACTION KL rose faster than THINK KL: check the outputs for action hacking."
    elif d_action > d_think:
        verdict = (f"ACTION KL rose by less than {MIN_KL_GAP} nats/token more than THINK KL: "
                   "too small to read as action hacking.")
    else:
        verdict = "ACTION KL did not rise faster than THINK KL: no sign of action hacking."
    return [f"THINK KL {think[0]:.4f} → {think[1]:.4f} ({d_think:+.4f}); ACTION KL "
            f"{action[0]:.4f} → {action[1]:.4f} ({d_action:+.4f}). {verdict}"]


def warmup_reading(warm: pd.DataFrame) -> list[str]:
    """Did the critic's loss come down before the actor started moving?"""
    fl = first_last(warm, "value_loss")
    if not fl:
        return []
    return ([f"- value loss: {fl[0]:.4f} → {fl[1]:.4f} over {fl[2]} warm-up iteration(s)."]
            + explained_variance_reading(warm, "warm-up iteration(s)"))
