"""Training plots beyond the per-iteration curves: success pooled into blocks with Wilson intervals,
where each iteration's time goes, and the mix of executed actions. As in plots.py, each returns
False, writing nothing, when the metrics it needs were not logged."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import MaxNLocator  # noqa: E402
import pandas as pd  # noqa: E402

from longturn.report.plots import FINAL_COLOUR, present_keys, save_drawn  # noqa: E402
from longturn.report.training import PHASE_KEYS, SuccessBlock, action_mix, numeric  # noqa: E402

PHASE_COLOURS = {"seconds_rollout": "#1f77b4", "seconds_scoring": "#ff7f0e",
                 "seconds_update": "#2ca02c", "seconds_sync": "#9467bd",
                 "seconds_checkpoint": "#8c564b"}


def plot_success_blocks(blocks: list[SuccessBlock], path: str | Path) -> bool:
    """One point per block at its mean iteration: vertical bar = Wilson 95% CI, horizontal bar =
    the iterations it pools, label = ended episodes in it."""
    if not blocks:
        return False
    fig, ax = plt.subplots(figsize=(7.2, 3.8))
    xs = [b.iteration for b in blocks]
    ys = [b.rate for b in blocks]
    yerr = [[max(0.0, b.rate - b.low) for b in blocks], [max(0.0, b.high - b.rate) for b in blocks]]
    xerr = [[b.iteration - b.first_iteration for b in blocks],
            [b.last_iteration - b.iteration for b in blocks]]
    ax.errorbar(xs, ys, yerr=yerr, xerr=xerr, fmt="o", color=FINAL_COLOUR, ecolor="black",
                elinewidth=1, capsize=3, markersize=5)
    for b in blocks:
        ax.annotate(f"n={b.episodes}", (b.iteration, b.high), textcoords="offset points",
                    xytext=(0, 4), ha="center", fontsize=7)
    ax.set_ylim(-0.03, 1.12)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel("success rate of ended episodes")
    ax.set_title("Training success pooled into blocks of iterations\n(vertical: Wilson 95% CI; "
                 "horizontal: iterations pooled; n: ended episodes)", fontsize=10)
    ax.grid(alpha=0.3)
    return save_drawn(fig, path)


def _stacked_bars(ax: plt.Axes, frame: pd.DataFrame, colours: list[str]) -> None:
    """Columns of `frame` stacked per index value; touching bars when there are many iterations."""
    width = 0.8 if len(frame) <= 40 else 1.0
    bottom = pd.Series(0.0, index=frame.index)
    for column, colour in zip(frame.columns, colours):
        ax.bar(frame.index, frame[column], width, bottom=bottom, color=colour,
               label=str(column).removeprefix("seconds_"), linewidth=0)
        bottom = bottom + frame[column]
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_timing(df: pd.DataFrame, path: str | Path) -> bool:
    """Seconds per phase stacked per iteration (dots: the measured seconds_per_iteration), and
    turns/s below when logged."""
    phases = present_keys(df, PHASE_KEYS)
    if not phases:
        return False
    frame = df[phases].apply(pd.to_numeric, errors="coerce").dropna(how="all").fillna(0.0)
    rate = numeric(df, "turns_per_s")
    below = 1 if len(rate) else 0  # a panel of turns/s under the bars, when logged
    fig, axes = plt.subplots(1 + below, 1, figsize=(7.6, 3.4 + 2.0 * below),
                             sharex=True, squeeze=False, height_ratios=[3] + [2] * below)
    ax = axes[0, 0]
    _stacked_bars(ax, frame, [PHASE_COLOURS[k] for k in phases])
    total = numeric(df, "seconds_per_iteration")
    if len(total):
        ax.plot(total.index, total.values, "o", color="black", markersize=3,
                label="seconds per iteration")
    ax.set_ylabel("seconds")
    ax.set_title("Where the time goes: seconds per phase in each iteration", fontsize=10)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    if below:
        low = axes[1, 0]
        low.plot(rate.index, rate.values, marker="o" if len(rate) <= 30 else None, markersize=3,
                 color="#d62728")
        low.set_ylabel("turns / s")
        low.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("iteration")
    return save_drawn(fig, path)


def plot_action_mix(df: pd.DataFrame, path: str | Path) -> bool:
    """Share of turns per executed action, stacked per iteration: a collapse shows as one band
    taking the whole height."""
    mix = action_mix(df)
    if mix.empty:
        return False
    cmap = plt.get_cmap("tab20")
    colours = [cmap(i % cmap.N) for i in range(len(mix.columns))]
    fig, ax = plt.subplots(figsize=(7.6, 3.8))
    mix = mix.fillna(0.0)
    _stacked_bars(ax, mix, colours)
    ax.set_ylim(0, max(1.0, float(mix.sum(axis=1).max())))
    ax.set_xlabel("iteration")
    ax.set_ylabel("share of turns")
    ax.set_title("Action mix: share of turns per executed action", fontsize=10)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_drawn(fig, path)
