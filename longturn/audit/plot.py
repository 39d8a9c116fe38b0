"""`plot RUN_DIR --out DIR`: PNGs of the return and advantage distributions (per turn, at the first
response token: the state's value target and the advantage of its first token) and the executed
action mix per iteration."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import pandas as pd  # noqa: E402

from longturn.audit.output import Output  # noqa: E402
from longturn.audit.run_files import Run, read_turns  # noqa: E402
from longturn.report.plots import save_png  # noqa: E402  (atomic: never a half-written PNG)

COLUMNS = ("iteration", "action")
TRAINING = ("returns", "advantages")


def first_tokens(frame: pd.DataFrame, column: str) -> pd.Series:
    """Entry 0 of each row's per-token list; rows without one (evaluation turns) dropped."""
    values = frame[column].map(lambda v: float(v[0]) if v is not None and len(v) else None)
    return pd.to_numeric(values, errors="coerce").dropna()


def _distribution(frame: pd.DataFrame, column: str, label: str, path: Path) -> Path | None:
    values = first_tokens(frame, column)
    if values.empty:
        return None
    per_iteration = [first_tokens(g, column) for _, g in frame.groupby("iteration", sort=True)]
    labels = [str(i) for i in sorted(frame["iteration"].unique())]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    left.hist(values, bins=min(40, max(5, len(values) // 4)), color="#1f77b4")
    left.set(title=f"{label}: {len(values)} turns", xlabel=label, ylabel="turns")
    right.boxplot([s if len(s) else [float("nan")] for s in per_iteration], tick_labels=labels)
    right.set(title=f"{label} per iteration", xlabel="iteration", ylabel=label)
    return save_png(fig, path)


def _action_mix(frame: pd.DataFrame, path: Path) -> Path:
    mix = pd.crosstab(frame["iteration"], frame["action"].fillna("(none)"), normalize="index")
    fig, ax = plt.subplots(figsize=(max(5, 0.5 * len(mix) + 3), 3.6))
    mix.plot.bar(stacked=True, ax=ax, width=0.8, colormap="tab10", rot=0)
    ax.set(title="executed action mix per iteration", xlabel="iteration",
           ylabel="fraction of turns", ylim=(0, 1))
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    return save_png(fig, path)


def plot_run(run: Run, out: Path) -> Output:
    frame = read_turns(run, COLUMNS, optional=TRAINING)
    written, skipped = [], []
    for column, label in (("returns", "return"), ("advantages", "advantage")):
        path = _distribution(frame, column, label, out / f"{column}.png")
        (written if path else skipped).append(path or f"{column}.png")
    written.append(_action_mix(frame, out / "action_mix.png"))
    lines = [f"wrote {p}" for p in written]
    lines += [f"skipped {name}: no {name[:-4]} in these files (evaluation turns are not scored)"
              for name in skipped]
    return Output("\n".join(lines), {"written": [str(p) for p in written],
                                     "skipped": [str(s) for s in skipped]})
