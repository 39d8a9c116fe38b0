"""Prompt validation: before spending compute on RL, check prompts fit and the model can answer;
its gate and its markdown report.

Per task: play the first reply of several seeds as training plays it, check the token budget
(including the worst case of a full history window of maximum-length replies), and measure how
often the answer is a valid action before and after synonym translation, how it fails, and how
long and varied the THINK parts are. A task below the gate fails the stage.

The gate is a file: `passed` (PASSED_MARKER) is written only when every task passes, and removed
before a run starts, so a failed or interrupted validation never leaves one behind; training
stages depend on it in dvc.yaml. Its content is constant, so a validation rerun that passes again
does not rerun training.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longturn.agent.memory import HistoryEntry
from longturn.agent.prompts import build_messages, render
from longturn.agent.token_cache import expand_image_tokens
from longturn.params.config import Params
from longturn.engines.base import Engine, SamplingParams, engine_image_token
from longturn.envs.actions import EMPTY, NO_ACTION, UNKNOWN
from longturn.envs.base import TextEnv
from longturn.envs.registry import make_env
from longturn.errors import UserError
from longturn.reply_format import parse_reply
from longturn.rollout.conversation_episodes import first_replies
from longturn.rollout.conversation_setup import ConversationRun
from longturn.vision.encoder import IMAGE_PLACEHOLDER

PASSED_MARKER = "passed"
PASSED_TEXT = "every task's valid-action ratio is at or above validation.min_valid_action_ratio\n"
FAILURES = (NO_ACTION, UNKNOWN, EMPTY, "multiple_actions", "cut_by_length")


class GateFailed(UserError):
    """A task is below the gate. Like every other mistake a user fixes (a prompt, a setting, the
    model), it is one line and exit 2; the report that explains it is already written."""

    def __init__(self, failures: list[str], report: Path) -> None:
        super().__init__(f"gate failed: {'; '.join(failures)}; see {report}")


@dataclass
class TaskValidation:
    """Samples and metrics of one task."""

    task: str
    samples: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)


def think_text(output: str) -> str:
    """The THINK part of an output ('' when it has no THINK tag)."""
    reply = parse_reply(output)
    return reply.think if reply.has_think else ""


def distinct_bigram_ratio(texts: list[str]) -> float:
    """Distinct word bigrams / all bigrams over a set of texts (1.0 = no repetition at all)."""
    bigrams = [b for t in texts for b in zip(t.lower().split(), t.lower().split()[1:])]
    return len(set(bigrams)) / len(bigrams) if bigrams else 0.0


def worst_case_prompt_tokens(tokenizer: Any, env: TextEnv, observation: str, params: Params,
                             image_token: tuple[int, int] | None = None) -> int:
    """Prompt length with a full history window whose replies are max_new_tokens long each
    (`image_token`: the current observation has a frame, of that many feature positions)."""
    reply = " ".join(["go"] * params.engine.sampling.max_new_tokens)  # about one token per word
    history = [HistoryEntry(observation, reply)] * params.prompt.history_turns
    current = observation if image_token is None else f"{IMAGE_PLACEHOLDER}\n{observation}"
    messages = build_messages(env.instructions, history, current, params.prompt.demonstration)
    return len(expand_image_tokens(render(tokenizer, messages)[1], image_token))


def failure_kind(reply: dict[str, Any]) -> str | None:
    """Why a first reply failed, one of FAILURES: cut by `max_new_tokens` before a valid action,
    the parser's failure, or several ACTION tags (the last one counts: valid, but worth a look);
    None for a clean reply."""
    if reply["finish_reason"] == "length" and not reply["action_valid"]:
        return "cut_by_length"
    if reply["action_failure"]:
        return reply["action_failure"]
    return "multiple_actions" if parse_reply(reply["response_text"]).n_action_tags > 1 else None


def task_metrics(samples: list[dict[str, Any]], actions: list[str], tokenizer: Any,
                 worst_case: int, budget: int) -> dict[str, Any]:
    """The task's row of the report, read from its samples (`actions`: the env's own names, for
    the ratio of replies valid before synonym translation)."""
    replies = [s["replies"][0] for s in samples]
    thinks = [think_text(r["response_text"]) for r in replies]
    think_tokens = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) if t else 0
                    for t in thinks]
    n = len(samples)
    metrics = {
        "samples": n,
        "valid_action_ratio": sum(r["action_valid"] for r in replies) / n,
        "valid_before_translation_ratio":
            sum(r["raw_action"].strip() in actions for r in replies) / n,
        "prompt_tokens_mean": sum(len(s["prompt_ids"]) for s in samples) / n,
        "prompt_tokens_max": max(len(s["prompt_ids"]) for s in samples),
        "worst_case_prompt_tokens": worst_case,
        "max_prompt_tokens": budget,
        "history_fits_budget": worst_case <= budget,
        "response_tokens_mean": sum(len(s["response_ids"]) for s in samples) / n,
        "think_present_ratio": sum(bool(t) for t in thinks) / n,
        "think_tokens_mean": sum(think_tokens) / n,
        "think_distinct_bigram_ratio": distinct_bigram_ratio(thinks),
    }
    kinds = [failure_kind(r) for r in replies]
    for kind in FAILURES:
        metrics[f"failure_{kind}"] = kinds.count(kind) / n
    return metrics


def validate_env_task(engine: Engine, tokenizer: Any, params: Params, task: str,
                      sampling: SamplingParams, seeds: list[int]) -> TaskValidation:
    """The first reply of `task` of `env.name` on each seed, played as training plays it (the
    env's conversation, `first_replies`), and the budget of a full history window checked on
    the first seed's observation. The envs step in this process whatever `env.workers` says:
    each is reset and stepped once, and a worker process per seed would cost more than that."""
    in_process = params.model_copy(update={"env": params.env.model_copy(update={"workers": False})})
    samples = first_replies(ConversationRun.of_env(in_process, [task], progress=False), engine,
                            tokenizer, sampling, task, seeds, "validation")
    with closing(make_env(params.env.name, task, **params.env.kwargs)) as env:
        first, _ = env.reset(seed=seeds[0])
        image_token = None if first.image is None else engine_image_token(engine)
        worst = worst_case_prompt_tokens(tokenizer, env, first.text, params, image_token)
        actions = list(env.actions)
    return TaskValidation(task, samples, task_metrics(samples, actions, tokenizer, worst,
                                                      params.prompt.max_prompt_tokens))


def gate_failures(results: list[TaskValidation], min_ratio: float) -> list[str]:
    """Human-readable reasons the gate fails (empty list = pass)."""
    failures = []
    for r in results:
        m = r.metrics
        if m["valid_action_ratio"] < min_ratio:
            worst = max(FAILURES, key=lambda k: m[f"failure_{k}"])
            failures.append(
                f"task {r.task!r}: valid-action ratio {m['valid_action_ratio']:.2f} < "
                f"validation.min_valid_action_ratio {min_ratio:.2f} "
                f"(most common failure: {worst}, {m[f'failure_{worst}']:.0%} of samples)")
    return failures


_COLUMNS = [
    ("valid", "valid_action_ratio", "{:.2f}"),
    ("valid (strict)", "valid_before_translation_ratio", "{:.2f}"),
    ("prompt tok (max)", "prompt_tokens_max", "{}"),
    ("worst-case tok", "worst_case_prompt_tokens", "{}"),
    ("THINK present", "think_present_ratio", "{:.2f}"),
    ("THINK tok", "think_tokens_mean", "{:.1f}"),
    ("THINK distinct bigrams", "think_distinct_bigram_ratio", "{:.2f}"),
]


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
    head = ["task"] + [c[0] for c in _COLUMNS] + [f.replace("_", " ") for f in FAILURES]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r.task] + [fmt.format(r.metrics[key]) for _, key, fmt in _COLUMNS]
        cells += [f"{r.metrics['failure_' + f]:.2f}" for f in FAILURES]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for r in results:
        lines += [f"## {r.task}", "", "First prompt, exactly as the model sees it:", ""]
        lines += fence(r.samples[0]["prompt_text"]) + [""]
        for s in r.samples[:examples_per_task]:
            reply = s["replies"][0]
            status = "valid" if reply["action_valid"] else f"invalid ({failure_kind(reply)})"
            lines += [f"Seed {s['episode_seed']}: {status}, executed `{reply['action']}`", ""]
            lines += fence(reply["response_text"]) + [""]
    return "\n".join(lines)
