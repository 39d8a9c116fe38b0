"""The human-readable validation report (markdown): per-task table, failures, example prompts."""

from __future__ import annotations

from typing import Any

from longturn.run.validation import FAILURES, TaskValidation, failure_kind

_COLUMNS = [
    ("valid", "valid_action_ratio", "{:.2f}"),
    ("valid (strict)", "valid_before_translation_ratio", "{:.2f}"),
    ("prompt tok (max)", "prompt_tokens_max", "{}"),
    ("worst-case tok", "worst_case_prompt_tokens", "{}"),
    ("THINK present", "think_present_ratio", "{:.2f}"),
    ("THINK tok", "think_tokens_mean", "{:.1f}"),
    ("THINK distinct bigrams", "think_distinct_bigram_ratio", "{:.2f}"),
]


def _table(results: list[TaskValidation]) -> list[str]:
    head = ["task"] + [c[0] for c in _COLUMNS] + [f.replace("_", " ") for f in FAILURES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r.task] + [fmt.format(r.metrics[key]) for _, key, fmt in _COLUMNS]
        cells += [f"{r.metrics['failure_' + f]:.2f}" for f in FAILURES]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def fence(text: str) -> list[str]:
    """`text` as a markdown code block that no fence inside it can close."""
    return ["```text", text.replace("```", "ʼʼʼ"), "```"]


def render_report(results: list[TaskValidation], failures: list[str], gate: float,
                  settings: dict[str, Any], examples_per_task: int = 3) -> str:
    """Markdown: verdict, what was measured, the table, then example prompts and outputs."""
    verdict = "FAILED" if failures else "passed"
    lines = [f"# Prompt validation: {verdict}", ""]
    lines += [f"Gate: every task needs a valid-action ratio (after synonym translation) of at "
              f"least {gate:.2f}."]
    lines += [f"- {f}" for f in failures] + [""]
    lines += ["Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), ""]
    lines += ["Columns: *valid* counts outputs whose ACTION translates to a legal action; "
              "*strict* counts outputs whose ACTION text is already exactly an action name; "
              "*worst-case tok* is the prompt with a full history window of maximum-length "
              "replies (over the budget, the oldest history is dropped at run time); failure "
              "columns are fractions of samples.", ""]
    lines += _table(results) + [""]
    for r in results:
        lines += [f"## {r.task}", "", "First prompt, exactly as the model sees it:", ""]
        lines += fence(r.samples[0]["prompt_text"]) + [""]
        for s in r.samples[:examples_per_task]:
            reply = s["replies"][0]
            status = "valid" if reply["action_valid"] else f"invalid ({failure_kind(reply)})"
            lines += [f"Seed {s['episode_seed']}: {status}, executed `{reply['action']}`", ""]
            lines += fence(reply["response_text"]) + [""]
    return "\n".join(lines)
