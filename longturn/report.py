"""The run report: zero-shot vs final per task with Wilson intervals, training curves, KL, warm-up.

Inputs are the two eval `metrics.json` files (layout of `evaluation.metrics_by_task`) and the
DVCLive folders of training and critic warm-up. Any of them may be absent (a partial run, a
pipeline without warm-up): the report is still written and says what was missing, because a
report that silently drops a section reads as if that section had nothing to show.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pandas as pd

from longturn.atomic import write_text
from longturn.report_plots import plot_kl, plot_learning_curves, plot_task_bars, plot_warmup
from longturn.stats import wilson_interval

log = logging.getLogger(__name__)

TRAIN_KEYS = [
    "success_rate", "mean_reward", "episode_length", "valid_action_ratio", "kl_think",
    "kl_action", "kl_mean", "policy_loss", "value_loss", "explained_variance", "clip_fraction",
    "approx_kl", "entropy", "logprob_gap", "tokens_per_s", "seconds_per_iteration",
]
SIDES = ("zero_shot", "final")


# --------------------------------------------------------------------------- reading inputs

def _read_tsv(path: Path) -> pd.Series | None:
    """One DVCLive plot file (`step`, the metric, maybe `timestamp`) as a step-indexed Series."""
    try:
        frame = pd.read_csv(path, sep="\t")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, OSError) as err:
        log.warning("skipping unreadable metrics file %s: %s", path, err)
        return None
    values = [c for c in frame.columns if c not in ("step", "timestamp")]
    if "step" not in frame.columns or not values or frame.empty:
        return None
    s = pd.Series(pd.to_numeric(frame[values[-1]], errors="coerce").to_numpy(),
                  index=frame["step"].astype(int))
    return s[~s.index.duplicated(keep="last")]  # a restarted run re-logs steps: the last one counts


def _strip_namespace(columns: dict[str, Any]) -> dict[str, Any]:
    """`train/kl_think` -> `kl_think`, unless two namespaces would then share a name."""
    short = [name.split("/", 1)[-1] for name in columns]
    return {(s if short.count(s) == 1 else name): v for s, (name, v) in zip(short, columns.items())}


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
            out[f"{prefix}{key}"] = float(value)
    return out


def _from_summary(path: Path) -> pd.DataFrame:
    """Fallback when the plot files are gone: the last step from metrics.json, as one row."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return pd.DataFrame()
    row = _strip_namespace(_flatten(data))
    if not row:
        return pd.DataFrame()
    return pd.DataFrame([row], index=pd.Index([int(data.get("step", 0))], name="step"))


def read_live_metrics(live_dir: str | Path) -> pd.DataFrame:
    """DVCLive folder -> one row per step (index `step`), one column per key minus namespace."""
    live = Path(live_dir)
    root = live / "plots" / "metrics"
    columns: dict[str, pd.Series] = {}
    for tsv in sorted(root.rglob("*.tsv")) if root.is_dir() else []:
        series = _read_tsv(tsv)
        if series is not None:
            columns[tsv.relative_to(root).with_suffix("").as_posix()] = series
    if not columns:
        return _from_summary(live / "metrics.json")
    df = pd.DataFrame(_strip_namespace(columns)).sort_index()
    df.index.name = "step"
    return df


def read_eval_metrics(eval_dir: str | Path) -> dict[str, Any]:
    """An eval stage's metrics.json, or {} when it is absent or unreadable."""
    try:
        return json.loads((Path(eval_dir) / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}


# --------------------------------------------------------------------------- comparison table

def _side(m: dict[str, Any] | None) -> dict[str, Any] | None:
    """Success with a Wilson interval recomputed from the counts (so old files without CIs work)."""
    if not m or not m.get("episodes"):
        return None
    n = int(m["episodes"])
    wins = int(m["successes"]) if "successes" in m else round(m.get("success_rate", 0.0) * n)
    low, high = wilson_interval(wins, n)
    return {"episodes": n, "successes": wins, "success": wins / n, "low": low, "high": high,
            "mean_length": m.get("mean_length"), "valid_action_ratio": m.get("valid_action_ratio")}


def _row(task: str, zs: dict[str, Any] | None, fin: dict[str, Any] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"task": task}
    for name, side in zip(SIDES, (_side(zs), _side(fin))):
        for key in ("episodes", "successes", "success", "low", "high", "mean_length",
                    "valid_action_ratio"):
            row[f"{name}_{key}"] = side[key] if side else None
    both = row["zero_shot_success"] is not None and row["final_success"] is not None
    row["delta"] = row["final_success"] - row["zero_shot_success"] if both else None
    row["overlap"] = (row["zero_shot_low"] <= row["final_high"]
                      and row["final_low"] <= row["zero_shot_high"]) if both else None
    return row


def comparison_table(zero_shot: dict[str, Any], final: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per task (union of both evals, zero-shot order first), then an `overall` row."""
    zs_tasks, fin_tasks = zero_shot.get("tasks") or {}, final.get("tasks") or {}
    tasks = list(zs_tasks) + [t for t in fin_tasks if t not in zs_tasks]
    rows = [_row(t, zs_tasks.get(t), fin_tasks.get(t)) for t in tasks]
    if zero_shot.get("overall") or final.get("overall"):
        rows.append(_row("overall", zero_shot.get("overall"), final.get("overall")))
    return rows


# --------------------------------------------------------------------------- markdown

def _success_cell(row: dict[str, Any], side: str) -> str:
    if row[f"{side}_success"] is None:
        return "—"
    return (f"{row[f'{side}_successes']}/{row[f'{side}_episodes']} = {row[f'{side}_success']:.2f} "
            f"[{row[f'{side}_low']:.2f}, {row[f'{side}_high']:.2f}]")


def _pair(row: dict[str, Any], key: str, fmt: str) -> str:
    return " → ".join("—" if row[f"{s}_{key}"] is None else fmt.format(row[f"{s}_{key}"])
                      for s in SIDES)


def table_markdown(table: list[dict[str, Any]]) -> list[str]:
    """The per-task markdown table; the overall row is bold."""
    head = ["task", "zero-shot success [95% CI]", "final success [95% CI]", "Δ",
            "mean length (zero-shot → final)", "valid-action ratio (zero-shot → final)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        task = f"**{r['task']}**" if r["task"] == "overall" else r["task"]
        delta = "—" if r["delta"] is None else f"{r['delta']:+.2f}"
        cells = [task, _success_cell(r, "zero_shot"), _success_cell(r, "final"), delta,
                 _pair(r, "mean_length", "{:.1f}"), _pair(r, "valid_action_ratio", "{:.2f}")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def eval_reading(table: list[dict[str, Any]]) -> list[str]:
    """Plain-language verdict per task; overlapping intervals are read as no detectable change."""
    lines = []
    for r in table:
        if r["delta"] is None:
            lines.append(f"- **{r['task']}**: only one evaluation has this task; no comparison.")
        elif r["overlap"]:
            lines.append(f"- **{r['task']}**: Δ {r['delta']:+.2f}, the 95% intervals overlap: "
                         f"no significant change at this sample size "
                         f"({r['zero_shot_episodes']} vs {r['final_episodes']} episodes).")
        else:
            word = "higher" if r["delta"] > 0 else "lower"
            lines.append(f"- **{r['task']}**: final success is {word} (Δ {r['delta']:+.2f}) and "
                         f"the 95% intervals do not overlap.")
    if lines:
        lines.append("")
        lines.append("Both evaluations play the same seeds, so the comparison is paired; "
                     "non-overlapping Wilson intervals are a conservative test of a difference.")
    return lines


def _first_last(df: pd.DataFrame, key: str) -> tuple[float, float, int] | None:
    if key not in df.columns:
        return None
    s = pd.to_numeric(df[key], errors="coerce").dropna()
    return (float(s.iloc[0]), float(s.iloc[-1]), len(s)) if len(s) else None


def training_reading(df: pd.DataFrame) -> list[str]:
    """First vs last value of the headline curves, stated without over-reading one noisy run."""
    lines = []
    for key in ("success_rate", "mean_reward", "valid_action_ratio", "explained_variance"):
        fl = _first_last(df, key)
        if fl:
            which = " in which an episode ended" if key == "success_rate" else ""
            lines.append(f"- {key.replace('_', ' ')}: {fl[0]:.3f} → {fl[1]:.3f} over {fl[2]} "
                         f"iteration(s){which}.")
    return lines


# KL is in nats per token. Below this gap between the two rises, "faster" is not worth a flag.
MIN_KL_GAP = 0.01


def kl_reading(df: pd.DataFrame) -> list[str]:
    """Flags action KL rising faster than think KL (the action-hacking signature)."""
    think, action = _first_last(df, "kl_think"), _first_last(df, "kl_action")
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
    fl = _first_last(warm, "value_loss")
    if not fl:
        return []
    return [f"- value loss: {fl[0]:.4f} → {fl[1]:.4f} over {fl[2]} warm-up iteration(s)."]


# --------------------------------------------------------------------------- the report

def _section(title: str, drawn: bool, image: str, alt: str, body: list[str], why: str) -> list[str]:
    lines = [f"## {title}", ""] + body + ([""] if body else [])
    lines += [f"![{alt}]({image})"] if drawn else [f"*No plot: {why}.*"]
    return lines + [""]


def _settings(title_info: dict[str, Any]) -> list[str]:
    def show(v: Any) -> str:
        return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
    return [f"- **{k}**: {show(v)}" for k, v in title_info.items()]


def _missing(zs: dict, fin: dict, train: pd.DataFrame, warm: pd.DataFrame,
             dirs: dict[str, Path]) -> list[str]:
    """Human-readable list of every input (or training key) the report could not find."""
    out = []
    if not zs:
        out.append(f"zero-shot evaluation (`{dirs['zero_shot']}/metrics.json`)")
    if not fin:
        out.append(f"final evaluation (`{dirs['final']}/metrics.json`)")
    if train.empty:
        out.append(f"training metrics (no DVCLive metrics in `{dirs['train']}`)")
    else:
        gone = [k for k in TRAIN_KEYS if k not in train.columns]
        out += [f"training metric(s) not logged: {', '.join(gone)}"] if gone else []
    if warm.empty:
        out.append(f"critic warm-up metrics (no DVCLive metrics in `{dirs['warmup']}`)")
    return out


def build_report(zero_shot_dir: str | Path, final_dir: str | Path, train_live_dir: str | Path,
                 warmup_live_dir: str | Path, out_dir: str | Path,
                 title_info: dict[str, Any]) -> Path:
    """Write out_dir/report.md and its PNGs; a plot without data is skipped, and said so."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    zs, fin = read_eval_metrics(zero_shot_dir), read_eval_metrics(final_dir)
    train, warm = read_live_metrics(train_live_dir), read_live_metrics(warmup_live_dir)
    table = comparison_table(zs, fin)
    drawn = {"tasks.png": plot_task_bars(table, out / "tasks.png"),
             "curves.png": plot_learning_curves(train, out / "curves.png"),
             "kl.png": plot_kl(train, out / "kl.png"),
             "warmup.png": plot_warmup(warm, out / "warmup.png")}
    for name, ok in drawn.items():
        if not ok:
            (out / name).unlink(missing_ok=True)  # never leave a stale plot from an earlier run
    dirs = {"zero_shot": Path(zero_shot_dir), "final": Path(final_dir),
            "train": Path(train_live_dir), "warmup": Path(warmup_live_dir)}
    missing = _missing(zs, fin, train, warm, dirs)
    lines = ["# longturn run report", ""] + _settings(title_info) + [""]
    evals = table_markdown(table) + [""] + eval_reading(table) if table else []
    lines += _section("Zero-shot vs final evaluation", drawn["tasks.png"], "tasks.png",
                      "success per task, zero-shot vs final", evals, "no evaluation metrics")
    lines += _section("Training curves", drawn["curves.png"], "curves.png", "training curves",
                      training_reading(train), "no training metrics")
    kl_body = kl_reading(train) if drawn["kl.png"] else []
    lines += _section("KL to the reference: THINK vs ACTION", drawn["kl.png"], "kl.png",
                      "KL think vs action", kl_body, "kl_think / kl_action were not logged")
    warm_body = warmup_reading(warm) if drawn["warmup.png"] else []
    lines += _section("Critic warm-up", drawn["warmup.png"], "warmup.png", "critic warm-up",
                      warm_body, "no warm-up value loss was logged")
    lines += ["## Missing inputs", ""] + ([f"- {m}" for m in missing] or ["None."]) + [""]
    path = write_text(out / "report.md", "\n".join(lines))
    log.info("report written to %s (%d plot(s), %d missing input(s))", path,
             sum(drawn.values()), len(missing))
    return path
