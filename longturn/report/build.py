"""The run report: zero-shot vs final per task (Wilson intervals, paired exact McNemar test),
how episodes ended (termination reasons, aborted episodes apart), training success pooled into
blocks, training curves, where the time goes, action mix, KL, warm-up.

Inputs are the two eval folders (`metrics.json`, layout of `evaluation.metrics_by_task`, and
`episodes.parquet`) and the DVCLive folders of training and critic warm-up. Any of them may be
absent (a partial run, a pipeline without warm-up): the report is still written and says what was
missing, because a report that silently drops a section reads as if it had nothing to show.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pandas as pd

from longturn.atomic import write_text
from longturn.report.evaluation import (aborted_reading, comparison_table, endings_table,
                                        eval_reading, pair_evaluations, table_markdown)
from longturn.report.plots import plot_kl, plot_learning_curves, plot_task_bars, plot_warmup
from longturn.report.training import (PHASE_KEYS, action_reading, kl_reading,
                                      pool_success_blocks, success_reading, termination_reading,
                                      timing_reading, training_reading, warmup_reading)
from longturn.report.replies import kl_mean_reading, replies_reading
from longturn.report.training_plots import plot_action_mix, plot_success_blocks, plot_timing

log = logging.getLogger(__name__)

# Keys every training run logs; a gap here is listed under "Missing inputs". Not listed: what a
# run may have nothing to count for (rollout/sample_metrics.py): the action mix and the THINK /
# ACTION KL without parsed actions, tool calls without conversations, peak_gpu_memory_gib on CPU.
CRITIC_KEYS = ("value_loss", "explained_variance", "lr_critic")  # logged only with a critic
TRAIN_KEYS = [
    "episodes_ended", "episodes_aborted", "successes", "success_rate", "mean_reward",
    "episode_length", "valid_action_ratio", "mean_tokens", "model_token_fraction", "kl_mean",
    "policy_loss", "value_loss", "explained_variance", "clip_fraction", "approx_kl", "entropy",
    "logprob_gap", "lr_actor", "lr_critic", "epochs_run", "tokens_per_s", "turns_per_s",
    "seconds_per_iteration", *PHASE_KEYS,
]


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


def read_live_metrics(live_dir: str | Path) -> pd.DataFrame:
    """DVCLive folder -> one row per step (index `step`), one column per key minus namespace."""
    live = Path(live_dir)
    root = live / "plots" / "metrics"
    columns: dict[str, pd.Series] = {}
    for tsv in sorted(root.rglob("*.tsv")) if root.is_dir() else []:
        series = _read_tsv(tsv)
        if series is not None:
            columns[tsv.relative_to(root).with_suffix("").as_posix()] = series
    if not columns:  # the plot files are gone: the last step from metrics.json, as one row
        data = read_metrics_json(live)
        row = _strip_namespace(_flatten(data))
        if not row:
            return pd.DataFrame()
        return pd.DataFrame([row], index=pd.Index([int(data.get("step", 0))], name="step"))
    df = pd.DataFrame(_strip_namespace(columns)).sort_index()
    df.index.name = "step"
    return df


def read_metrics_json(folder: str | Path) -> dict[str, Any]:
    """A folder's metrics.json (an eval's, or DVCLive's last step); {} if absent or unreadable."""
    try:
        return json.loads((Path(folder) / "metrics.json").read_text())
    except (OSError, ValueError):
        return {}


# --------------------------------------------------------------------------- the report

def _section(title: str, drawn: dict[str, bool], image: str, alt: str, body: list[str],
             why: str = "") -> list[str]:
    lines = [f"## {title}", ""] + body + ([""] if body else [])
    lines += [f"![{alt}]({image})"] if drawn[image] else [f"*No plot: {why}.*"]
    return lines + [""]


def _settings(title_info: dict[str, Any]) -> list[str]:
    def show(v: Any) -> str:
        return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
    return [f"- **{k}**: {show(v)}" for k, v in title_info.items()]


def _missing(zs: dict, fin: dict, train: pd.DataFrame, warm: pd.DataFrame,
             dirs: dict[str, Path], why_unpaired: str | None, critic: bool) -> list[str]:
    """Human-readable list of every input (or training key) the report could not find."""
    out = []
    if not zs:
        out.append(f"zero-shot evaluation (`{dirs['zero_shot']}/metrics.json`)")
    if not fin:
        out.append(f"final evaluation (`{dirs['final']}/metrics.json`)")
    if why_unpaired:
        out.append(f"paired episodes: {why_unpaired}")
    if train.empty:
        out.append(f"training metrics (no DVCLive metrics in `{dirs['train']}`)")
    else:
        logged = set(train.columns) | ({"explained_variance"} if "return_variance" in train.columns
                                       else set())  # logged, but never meaningful: not missing
        gone = [k for k in TRAIN_KEYS if k not in logged and (critic or k not in CRITIC_KEYS)]
        out += [f"training metric(s) not logged: {', '.join(gone)}"] if gone else []
    if warm.empty and critic:
        out.append(f"critic warm-up metrics (no DVCLive metrics in `{dirs['warmup']}`)")
    return out


def _draw(out: Path, table: list, blocks: list, train: pd.DataFrame,
          warm: pd.DataFrame) -> dict[str, bool]:
    """Every plot, by file name -> drawn; a plot not drawn this time loses its stale file."""
    plots = {"tasks.png": (plot_task_bars, table), "success.png": (plot_success_blocks, blocks),
             "curves.png": (plot_learning_curves, train), "timing.png": (plot_timing, train),
             "actions.png": (plot_action_mix, train), "kl.png": (plot_kl, train),
             "warmup.png": (plot_warmup, warm)}
    drawn = {name: plot(data, out / name) for name, (plot, data) in plots.items()}
    for name, ok in drawn.items():
        if not ok:
            (out / name).unlink(missing_ok=True)  # never leave a stale plot from an earlier run
    return drawn


def _endings_section(zs: dict, fin: dict, train: pd.DataFrame) -> list[str]:
    """How episodes ended (termination reasons) in both evaluations and in training."""
    table = endings_table(zs, fin)
    readings = aborted_reading(zs, fin) + termination_reading(train)
    body = table + ([""] if table and readings else []) + readings
    if not body:
        return ["## How episodes ended", "", "*No termination counts in the inputs (written "
                "before they were counted).*", ""]
    note = ("Aborted episodes (env error: the env raised or its worker process died; timeout: "
            "no answer within `env.step_timeout_s`) are out of the loss and out of every success "
            "rate, counted here apart from failures, so a flaky env never reads as a weak policy. "
            "Time limit: truncated by the env or `env.max_turns`.")
    return ["## How episodes ended", ""] + body + ["", note, ""]


def _training_sections(drawn: dict[str, bool], train: pd.DataFrame, blocks: list) -> list[str]:
    """Success, curves and time; then how the policy replied, its actions when replies were
    parsed into actions, and its KL to the reference (by THINK / ACTION part where replies have
    one)."""
    phases = ", ".join(PHASE_KEYS)
    lines = (
        _section("Training success (pooled)", drawn, "success.png",
                 "training success pooled into blocks", success_reading(blocks),
                 "no episode counts to pool (episodes_ended with successes or success_rate)")
        + _section("Training curves", drawn, "curves.png", "training curves",
                   training_reading(train, blocks), "no training metrics")
        + _section("Where the time goes", drawn, "timing.png", "seconds per phase per iteration",
                   timing_reading(train), f"none of {phases} was logged"))
    body = replies_reading(train, blocks) or ["*No reply metrics were logged.*"]
    lines += ["## Replies", "", *body, ""]
    if drawn["actions.png"]:
        lines += _section("Action mix", drawn, "actions.png", "action mix per iteration",
                          action_reading(train))
    kl = kl_mean_reading(train) or ["*kl_mean was not logged.*"]
    if drawn["kl.png"]:
        return lines + _section("KL to the reference: THINK vs ACTION", drawn, "kl.png",
                                "KL think vs action",
                                kl + [f"- {line}" for line in kl_reading(train)])
    return lines + ["## KL to the reference", "", *kl, ""]


def build_report(zero_shot_dir: str | Path, final_dir: str | Path, train_live_dir: str | Path,
                 warmup_live_dir: str | Path, out_dir: str | Path,
                 title_info: dict[str, Any], critic: bool = True) -> Path:
    """Write out_dir/report.md and its PNGs; a plot without data is skipped, and said so.
    `critic=False` (a critic-free estimator): no warm-up and no value metrics are expected."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    zs, fin = read_metrics_json(zero_shot_dir), read_metrics_json(final_dir)
    paired, why_unpaired = pair_evaluations(zero_shot_dir, final_dir)
    train, warm = read_live_metrics(train_live_dir), read_live_metrics(warmup_live_dir)
    table = comparison_table(zs, fin)
    blocks = pool_success_blocks(train)
    drawn = _draw(out, table, blocks, train, warm)
    dirs = {"zero_shot": Path(zero_shot_dir), "final": Path(final_dir),
            "train": Path(train_live_dir), "warmup": Path(warmup_live_dir)}
    missing = _missing(zs, fin, train, warm, dirs, why_unpaired, critic)
    lines = ["# longturn run report", ""] + _settings(title_info) + [""]
    evals = (table_markdown(table, paired) + [""] if table else []) + eval_reading(
        table, paired, why_unpaired)
    lines += _section("Zero-shot vs final evaluation", drawn, "tasks.png",
                      "success per task, zero-shot vs final", evals, "no evaluation metrics")
    lines += _endings_section(zs, fin, train)
    lines += _training_sections(drawn, train, blocks)
    if critic:
        warm_body = warmup_reading(warm) if drawn["warmup.png"] else []
        lines += _section("Critic warm-up", drawn, "warmup.png", "critic warm-up",
                          warm_body, "no warm-up value loss was logged")
    else:
        lines += ["## Critic warm-up", "", "*No critic: the estimator compares episodes within "
                  "groups started from one seed, so there was nothing to warm up.*", ""]
    lines += ["## Missing inputs", ""] + ([f"- {m}" for m in missing] or ["None."]) + [""]
    path = write_text(out / "report.md", "\n".join(lines))
    log.info("report written to %s (%d plot(s), %d missing input(s))", path,
             sum(drawn.values()), len(missing))
    return path
