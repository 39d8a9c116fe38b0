"""`plot RUN_DIR --out DIR`: PNGs of the return and advantage distributions (per reply, at its first
token: the state's value target and the advantage of its first token; window and packed samples
alike) and the executed action mix per iteration (where replies execute env actions)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import pandas as pd  # noqa: E402

from longturn.audit.output import Output  # noqa: E402
from longturn.audit.replies import read_replies  # noqa: E402
from longturn.audit.reply_blocks import first_value  # noqa: E402
from longturn.audit.run_files import Run  # noqa: E402
from longturn.report.plots import save_png  # noqa: E402  (atomic: never a half-written PNG)

COLUMNS = ("iteration", "action", "returns", "advantages")


def first_tokens(frame: pd.DataFrame, column: str) -> pd.Series:
    """Entry 0 of each reply's per-token slice; replies without one (evaluation) dropped."""
    return pd.to_numeric(frame[column].map(first_value), errors="coerce").dropna()


def _distribution(frame: pd.DataFrame, column: str, label: str, path: Path) -> Path | None:
    values = first_tokens(frame, column)
    if values.empty:
        return None
    per_iteration = [first_tokens(g, column) for _, g in frame.groupby("iteration", sort=True)]
    labels = [str(i) for i in sorted(frame["iteration"].unique())]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    left.hist(values, bins=min(40, max(5, len(values) // 4)), color="#1f77b4")
    left.set(title=f"{label}: {len(values)} replies", xlabel=label, ylabel="replies")
    right.boxplot([s if len(s) else [float("nan")] for s in per_iteration], tick_labels=labels)
    right.set(title=f"{label} per iteration", xlabel="iteration", ylabel=label)
    return save_png(fig, path)


def _action_mix(frame: pd.DataFrame, path: Path) -> Path:
    mix = pd.crosstab(frame["iteration"], frame["action"].fillna("(none)"), normalize="index")
    fig, ax = plt.subplots(figsize=(max(5, 0.5 * len(mix) + 3), 3.6))
    mix.plot.bar(stacked=True, ax=ax, width=0.8, colormap="tab10", rot=0)
    ax.set(title="executed action mix per iteration", xlabel="iteration",
           ylabel="fraction of replies", ylim=(0, 1))
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    return save_png(fig, path)


def plot_run(run: Run, out: Path) -> Output:
    frame = read_replies(run, COLUMNS)
    frame["iteration"] = frame["iteration"].fillna(0).astype(int)
    written, skipped = [], []
    for column, label in (("returns", "return"), ("advantages", "advantage")):
        path = _distribution(frame, column, label, out / f"{column}.png")
        if path is None:
            skipped.append((f"{column}.png", f"no {label}s in these files (evaluation samples "
                                             "are not scored)"))
        else:
            written.append(path)
    if frame["action"].notna().any():
        written.append(_action_mix(frame, out / "action_mix.png"))
    else:
        skipped.append(("action_mix.png", "no executed actions (tool-call or free-text replies)"))
    lines = [f"wrote {p}" for p in written] + [f"skipped {name}: {why}" for name, why in skipped]
    return Output("\n".join(lines), {"written": [str(p) for p in written],
                                     "skipped": [name for name, _ in skipped],
                                     "replies": len(frame)})
