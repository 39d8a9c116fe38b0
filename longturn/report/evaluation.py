"""Zero-shot vs final: per-task table with Wilson intervals and the paired exact McNemar test.

Both evaluations play the same seeds per task, so the episodes pair up on (task, episode_seed);
the paired test reads the seeds whose outcome changed and is sharper than comparing two intervals.
When an episodes file is missing or unreadable the table stays and the report says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from longturn.envs.termination import PREFIX
from longturn.stats import PairedOutcome, paired_outcomes, wilson_interval

SIDES = ("zero_shot", "final")
# the table's two per-episode columns, mean_length and valid_action_ratio: a reply is valid when
# it parsed into one of the env's actions, or when none of its tool calls failed
EVAL_LABELS = ("replies per episode", "valid replies")
EPISODE_COLUMNS = ("task", "episode_seed", "success")
# why episodes end: env episodes (envs/termination.py), then conversations (rollout/conversation.py)
REASON_LABELS = {"success": "success", "failure": "failure", "time_limit": "time limit",
                 "env_error": "env error", "timeout": "timeout", "done": "done",
                 "max_assistant_turns": "max replies", "max_user_turns": "max user turns",
                 "token_budget": "token budget", "agent_error": "agent error"}


# --------------------------------------------------------------------------- paired episodes

def read_episodes(eval_dir: str | Path) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(task, episode_seed, success) rows of an eval's episodes.parquet, or None and why not.
    Aborted episodes (the env failed) are left out: they are neither a success nor a failure, so
    such a seed is unpaired."""
    path = Path(eval_dir) / "episodes.parquet"
    if not path.is_file():
        return None, f"`{path}` is missing"
    try:
        names = pq.read_schema(path).names
        lacking = [c for c in EPISODE_COLUMNS if c not in names]
        if lacking:
            return None, f"`{path}` has no column {', '.join(lacking)}"
        columns = list(EPISODE_COLUMNS) + (["aborted"] if "aborted" in names else [])
        rows = pq.read_table(path, columns=columns).to_pylist()
    except (OSError, ValueError, pa.ArrowException) as err:
        return None, f"`{path}` could not be read ({type(err).__name__}: {err})"
    return [{k: r[k] for k in EPISODE_COLUMNS} for r in rows if not r.get("aborted")], None


def pair_evaluations(zero_shot_dir: str | Path, final_dir: str | Path
                     ) -> tuple[dict[str, PairedOutcome], str | None]:
    """Paired outcomes per task and overall, or {} and the reason they could not be computed."""
    zs, why_zs = read_episodes(zero_shot_dir)
    fin, why_fin = read_episodes(final_dir)
    if zs is None or fin is None:
        return {}, "; ".join(w for w in (why_zs, why_fin) if w)
    try:
        return paired_outcomes(zs, fin), None
    except (ValueError, TypeError, KeyError) as err:  # duplicate or null seeds
        return {}, f"the episodes could not be paired ({err})"


def format_p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def paired_verdict(o: PairedOutcome) -> str:
    """'paired on N seeds: …' and what it means at the usual 0.05 / 0.01 levels."""
    if o.n_pairs == 0:
        return "No seed was played by both evaluations, so no paired test"
    text = (f"Paired on {o.n_pairs} seeds: {o.lost} lost, {o.gained} gained, "
            f"exact McNemar p = {format_p(o.p_value)}")
    if o.p_value < 0.05:
        level = "0.01" if o.p_value < 0.01 else "0.05 (not at 0.01)"
        better = "better" if o.gained > o.lost else "worse"
        return f"{text}: the final policy is {better}, significant at {level}"
    return f"{text}: not significant at 0.05"


def _unpaired(o: PairedOutcome) -> str:
    if not (o.unpaired_zero_shot or o.unpaired_final):
        return ""
    return (f" Unpaired episodes (played by one evaluation only): {o.unpaired_zero_shot} "
            f"zero-shot, {o.unpaired_final} final.")


# --------------------------------------------------------------------------- comparison table

def _side(m: dict[str, Any] | None) -> dict[str, Any] | None:
    """Success with a Wilson interval recomputed from the counts (so old files without CIs work),
    over the completed episodes (aborted ones apart; older files: over all episodes)."""
    if not m or not m.get("episodes"):
        return None
    n = int(m.get("completed_episodes", m["episodes"]))
    if n == 0:
        return None
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


def _paired_cell(o: PairedOutcome | None) -> str:
    if o is None or o.n_pairs == 0:
        return "—"
    return f"{o.lost} / {o.gained} of {o.n_pairs}, p = {format_p(o.p_value)}"


def table_markdown(table: list[dict[str, Any]], paired: dict[str, PairedOutcome]) -> list[str]:
    """The per-task markdown table; the overall row is bold."""
    head = ["task", "zero-shot success [95% CI]", "final success [95% CI]", "Δ",
            "paired lost / gained (exact McNemar p)", f"{EVAL_LABELS[0]} (zero-shot → final)",
            f"{EVAL_LABELS[1]} (zero-shot → final)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        task = f"**{r['task']}**" if r["task"] == "overall" else r["task"]
        delta = "—" if r["delta"] is None else f"{r['delta']:+.2f}"
        cells = [task, _success_cell(r, "zero_shot"), _success_cell(r, "final"), delta,
                 _paired_cell(paired.get(r["task"])), _pair(r, "mean_length", "{:.1f}"),
                 _pair(r, "valid_action_ratio", "{:.2f}")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _interval_verdict(r: dict[str, Any]) -> str:
    if r["delta"] is None:
        return "only one evaluation has this task; no comparison of rates."
    if r["overlap"]:
        return (f"Δ {r['delta']:+.2f}, the 95% intervals overlap "
                f"({r['zero_shot_episodes']} vs {r['final_episodes']} episodes).")
    word = "higher" if r["delta"] > 0 else "lower"
    return f"final success is {word} (Δ {r['delta']:+.2f}) and the 95% intervals do not overlap."


def eval_reading(table: list[dict[str, Any]], paired: dict[str, PairedOutcome],
                 why_unpaired: str | None) -> list[str]:
    """Plain-language verdict per task: the Wilson intervals, then the paired test when it ran."""
    lines = []
    tasks = [r["task"] for r in table]
    for r in table + [{"task": t, "delta": None} for t in paired if t not in tasks]:
        o = paired.get(r["task"])
        text = _interval_verdict(r) if "overlap" in r else "not in the metrics files."
        if o is not None:
            text += f" {paired_verdict(o)}.{_unpaired(o)}"
        lines.append(f"- **{r['task']}**: {text}")
    if why_unpaired:
        lines += ["", f"The paired McNemar test could not be computed: {why_unpaired}."]
    if lines:
        lines += ["", "Both evaluations play the same seeds, so the comparison is paired: the "
                  "exact McNemar test counts the seeds whose outcome changed (lost: zero-shot "
                  "success, final failure; gained: the reverse). Non-overlapping Wilson intervals "
                  "are a more conservative test of a difference."]
    return lines


# --------------------------------------------------------------------------- how episodes ended

def endings_table(zero_shot: dict[str, Any], final: dict[str, Any]) -> list[str]:
    """Per task and evaluation, episodes per termination reason (markdown); [] when neither
    metrics file counts them (written before termination reasons were counted)."""
    rows = []
    for name, metrics in (("zero-shot", zero_shot), ("final", final)):
        parts = list((metrics.get("tasks") or {}).items())
        parts += [("**overall**", metrics["overall"])] if metrics.get("overall") else []
        rows += [(task, name, m) for task, m in parts]
    # every reason is counted, zeros included: a column for those that ended an episode
    reasons = [r for r in REASON_LABELS if any(m.get(PREFIX + r) for _, _, m in rows)]
    if not reasons:
        return []
    head = ["task", "evaluation", *(REASON_LABELS[r] for r in reasons), "success rate over"]
    lines = []
    for task, name, m in rows:
        if not any(PREFIX + r in m for r in reasons):
            continue
        n = int(m.get("episodes", 0))
        done = int(m.get("completed_episodes", n))
        cells = [task, name, *(str(int(m.get(PREFIX + r, 0))) for r in reasons),
                 f"{done} of {n} episodes"]
        lines.append("| " + " | ".join(cells) + " |")
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + lines


def aborted_reading(zero_shot: dict[str, Any], final: dict[str, Any]) -> list[str]:
    """One line per evaluation that lost episodes to its env."""
    lines = []
    for name, metrics in (("zero-shot", zero_shot), ("final", final)):
        m = metrics.get("overall") or {}
        aborted = int(m.get("aborted_episodes", 0))
        if aborted:
            causes = ", ".join(f"{int(m.get(PREFIX + r, 0))} {REASON_LABELS[r]}"
                               for r in ("env_error", "timeout"))
            lines.append(f"- The {name} evaluation lost {aborted} of {int(m['episodes'])} "
                         f"episodes to the env ({causes}): they are left out of its success "
                         "rates and of the paired test; the stage log names each failure.")
    return lines
