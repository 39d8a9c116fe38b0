"""The report's PNG plots: learning curves, zero-shot vs final per task, KL, critic warm-up
(pooled success, timing and action mix are in training_plots).

Every function takes plain data (a metrics DataFrame indexed by step, or the comparison table) and a
path, draws with the non-interactive Agg backend and writes the PNG atomically. Each returns False
without writing when it has nothing to draw, so the report can say what is missing instead.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import FormatStrFormatter, MaxNLocator  # noqa: E402
import pandas as pd  # noqa: E402

from longturn.report.value_fit import (  # noqa: E402
    KEY as EV_KEY, explained_variance_series, not_meaningful_steps, numeric,
)

# success_rate is not here: one iteration may end a single episode, so it is drawn pooled into
# blocks with intervals (training_plots.plot_success_blocks) instead of per iteration.
CURVE_KEYS = [
    "mean_reward", "episode_length", "valid_action_ratio", "value_loss",
    "explained_variance", "clip_fraction", "approx_kl", "entropy",
    "logprob_gap", "policy_loss", "lr_actor", "lr_critic",
    "epochs_run", "tokens_per_s", "turns_per_s", "peak_gpu_memory_gib",
]
UNIT_RANGE = {"valid_action_ratio", "clip_fraction"}
ZS_COLOUR, FINAL_COLOUR = "#8c8c8c", "#1f77b4"


def save_png(fig: Any, path: str | Path) -> Path:
    """savefig to a temp name in the same folder, then rename: never a half-written PNG."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    os.replace(tmp, path)
    return path


def save_drawn(fig: Any, path: str | Path) -> bool:
    """Lay a report plot out and save it (save_png); True: what a plot function returns once it
    has drawn."""
    fig.tight_layout()
    save_png(fig, path)
    return True


def present_keys(df: pd.DataFrame, keys: list[str]) -> list[str]:
    """Keys of `keys` that are columns of `df` with at least one finite value."""
    return [k for k in keys if len(numeric(df, k))]


def curve_keys(df: pd.DataFrame, keys: list[str]) -> list[str]:
    """present_keys, plus explained variance where it was only "not meaningful" (its panel says
    so instead of vanishing as if it was never logged)."""
    present = present_keys(df, keys)
    if EV_KEY in keys and EV_KEY not in present and len(not_meaningful_steps(df)):
        present.insert(keys.index(EV_KEY), EV_KEY)
    return present


def _panel(ax: Any, df: pd.DataFrame, key: str, **kwargs: Any) -> None:
    """One metric's line and title; explained variance without its not-meaningful steps, their
    count in the title, and "not meaningful" across a panel left empty."""
    if key != EV_KEY:
        _line(ax, numeric(df, key), **kwargs)
        ax.set_title(key.replace("_", " "), fontsize=10)
        return
    s, steps = explained_variance_series(df), not_meaningful_steps(df)
    hidden = len(steps)
    if len(s):  # NaN at the hidden steps: the line breaks there instead of bridging them
        _line(ax, s.reindex(s.index.union(steps)), **kwargs)
    else:
        ax.text(0.5, 0.5, "not meaningful\n(near-constant returns)", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="#7f7f7f")
        ax.set_xticks([])
        ax.set_yticks([])
    note = f"\n({hidden} not meaningful: near-constant returns)" if hidden and len(s) else ""
    ax.set_title(f"explained variance{note}", fontsize=10 if not note else 8)


def _line(ax: Any, s: pd.Series, **kwargs: Any) -> None:
    """A line with markers when there are few points (a 1-point curve is still visible)."""
    marker = "o" if len(s) <= 30 else None
    ax.plot(s.index, s.values, marker=marker, markersize=3, linewidth=1.4, **kwargs)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations are whole numbers


def plot_learning_curves(df: pd.DataFrame, path: str | Path) -> bool:
    """A grid of small panels, one per training metric that was logged."""
    keys = curve_keys(df, CURVE_KEYS)
    if not keys:
        return False
    ncols = min(4, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.6 * nrows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= len(keys):
            ax.set_visible(False)
            continue
        key = keys[i]
        _panel(ax, df, key, color=FINAL_COLOUR)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if key in UNIT_RANGE:
            ax.set_ylim(-0.03, 1.03)
        if key.startswith("lr_"):  # plain 1e-05 ticks: the "1e-5" offset text hits the title
            ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
        if i >= len(keys) - ncols:
            ax.set_xlabel("iteration", fontsize=9)
    fig.suptitle("Training curves (one point per PPO iteration)", fontsize=12)
    return save_drawn(fig, path)


def _bar_errors(rows: list[dict[str, Any]], side: str) -> tuple[list[float], list[list[float]]]:
    """Heights and asymmetric Wilson error bars; a task missing on this side draws nothing."""
    heights, lower, upper = [], [], []
    for r in rows:
        p = r[f"{side}_success"]
        heights.append(math.nan if p is None else p)
        # float noise can put a bound past p
        lower.append(0.0 if p is None else max(0.0, p - r[f"{side}_low"]))
        upper.append(0.0 if p is None else max(0.0, r[f"{side}_high"] - p))
    return heights, [lower, upper]


def plot_task_bars(table: list[dict[str, Any]], path: str | Path) -> bool:
    """Grouped bars per task, zero-shot vs final success, with Wilson 95% intervals."""
    if not table:
        return False
    width = 0.38
    fig, ax = plt.subplots(figsize=(max(4.5, 1.5 * len(table) + 2), 3.8))
    xs = list(range(len(table)))
    for offset, side, label, colour in [(-width / 2, "zero_shot", "zero-shot", ZS_COLOUR),
                                        (width / 2, "final", "final", FINAL_COLOUR)]:
        heights, err = _bar_errors(table, side)
        pos = [x + offset for x in xs]
        ax.bar(pos, heights, width, yerr=err, capsize=4, color=colour, label=label,
               error_kw={"elinewidth": 1, "ecolor": "black"})
        for x, h, up in zip(pos, heights, err[1]):
            if not math.isnan(h):
                ax.text(x, h + up + 0.02, f"{h:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs, [_task_label(r) for r in table], fontsize=9)
    ax.set_ylim(0, 1.2)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_ylabel("success rate")
    ax.set_title("Success per task: zero-shot vs final (error bars: Wilson 95% CI)", fontsize=10)
    ax.legend(loc="upper right", fontsize=8, ncols=2, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return save_drawn(fig, path)


def _task_label(row: dict[str, Any]) -> str:
    n = [row.get(f"{s}_episodes") for s in ("zero_shot", "final")]
    counts = "/".join("–" if v is None else str(v) for v in n)
    return f"{row['task']}\n(n={counts})"


def plot_kl(df: pd.DataFrame, path: str | Path) -> bool:
    """KL on THINK vs ACTION tokens: action hacking shows as action KL rising faster."""
    keys = present_keys(df, ["kl_think", "kl_action", "kl_mean"])
    if "kl_action" not in keys:  # no reply had an ACTION tag: no split to draw
        return False
    styles = {"kl_think": ("THINK tokens", "#2ca02c", "-"),
              "kl_action": ("ACTION tokens", "#d62728", "-"),
              "kl_mean": ("all response tokens", "#7f7f7f", "--")}
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for key in keys:
        label, colour, style = styles[key]
        _line(ax, numeric(df, key), color=colour, linestyle=style, label=label)
    ax.set_xlabel("iteration")
    ax.set_ylabel("KL(π ‖ π_ref) per token")
    ax.set_title("KL to the reference policy, THINK vs ACTION tokens\n"
                 "(action hacking shows as action KL rising faster than think KL)", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    return save_drawn(fig, path)


def plot_warmup(df: pd.DataFrame, path: str | Path) -> bool:
    """Critic warm-up: value loss (and explained variance when logged) per warm-up iteration."""
    keys = curve_keys(df, ["value_loss", EV_KEY])
    if "value_loss" not in keys:
        return False
    fig, axes = plt.subplots(1, len(keys), figsize=(4.6 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        _panel(ax, df, key, color="#9467bd")
        s = numeric(df, key) if key == "value_loss" else None
        if s is not None and (s > 0).all() and s.max() > 30 * s.min():
            ax.set_yscale("log")
        ax.set_xlabel("warm-up iteration")
        ax.grid(alpha=0.3)
    fig.suptitle("Critic warm-up (actor frozen)", fontsize=11)
    return save_drawn(fig, path)
