"""Prompt validation with the chat protocol: before training, play a few whole episodes per task
with the base model, tools and interaction, and check that the prompts fit and the replies work.

A task fails the gate when its first context leaves no room for a reply, or when its
`valid_action_ratio` (the training metric: replies none of whose tool calls failed and, on an
env's task, that named a valid action) is below `validation.min_valid_action_ratio`. The
tokenization check runs on each episode: in `strict` a mismatch stops the stage with the first
differing span.
"""

from __future__ import annotations

import math
import re
from contextlib import closing
from typing import Any

from longturn.params.config import Params
from longturn.engines.base import Engine, SamplingParams
from longturn.rollout.conversation_episodes import packed_samples
from longturn.rollout.sample_metrics import ending, sample_metrics
from longturn.rollout.conversation_setup import ConversationRun
from longturn.run.validation import TaskValidation, fence
from longturn.vision.encoder import IMAGE_PLACEHOLDER


def task_metrics(samples: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    # what the model saw before its first reply (an episode with no reply: all of it)
    prompts = [len(s["prompt_ids"]) + (0 if s["replies"] else len(s["response_ids"]))
               for s in samples]
    m: dict[str, Any] = sample_metrics(samples)
    if math.isnan(m["valid_action_ratio"]):  # no reply was made: none passed
        m["valid_action_ratio"] = 0.0
    m.update(samples=len(samples), prompt_tokens_max=max(prompts),
             prompt_tokens_mean=sum(prompts) / len(prompts), max_tokens=budget,
             prompt_fits_budget=max(prompts) < budget)
    return m


def validate_conversation_tasks(engine: Engine, tokenizer: Any, params: Params,
                            sampling: SamplingParams, seeds: list[int]) -> list[TaskValidation]:
    """Play `seeds` of every eval task; one TaskValidation (episodes as samples) per task."""
    results = []
    with closing(ConversationRun.from_params(params, list(params.eval.tasks))) as run:
        for task in run.tasks:
            samples = packed_samples(run, engine, tokenizer, sampling, task, seeds, "validation")
            results.append(TaskValidation(task, samples,
                                          task_metrics(samples, params.rollout.chat.max_tokens)))
    return results


def conversation_gate_failures(results: list[TaskValidation], min_ratio: float) -> list[str]:
    """Why the gate fails (empty: it passes)."""
    failures = []
    for r in results:
        m = r.metrics
        if not m["prompt_fits_budget"]:
            failures.append(f"task {r.task!r}: a first context of {m['prompt_tokens_max']} "
                            f"tokens leaves no room for a reply in rollout.chat.max_tokens "
                            f"{m['max_tokens']}")
        if m["valid_action_ratio"] < min_ratio:
            validity = m["tool_call_validity"]  # NaN when no call was made
            read = [reply for s in r.samples for reply in s["replies"]
                    if reply["action"] is not None]  # replies an env read as its actions
            if not m["turns"]:
                why = "no reply was made"
            elif read:
                why = (f"{sum(not reply['action_valid'] for reply in read)} of {len(read)} "
                       "replies named no valid action of the env")
            elif math.isnan(m["tool_calls_per_episode"]):  # a slime Sample's: not counted
                why = "the rollout does not count tool calls"
            elif math.isnan(validity):
                why = "no tool call was made"
            else:
                why = (f"{m['tool_calls_per_episode']:.1f} tool calls per episode, "
                       f"{validity:.0%} of them did not fail")
            failures.append(f"task {r.task!r}: valid-reply ratio {m['valid_action_ratio']:.2f} < "
                            f"validation.min_valid_action_ratio {min_ratio:.2f} ({why})")
    return failures


_COLUMNS = [("episodes", "samples", "{}"), ("valid replies", "valid_action_ratio", "{:.2f}"),
            ("tool calls / ep", "tool_calls_per_episode", "{:.2f}"),
            ("tool-call validity", "tool_call_validity", "{:.2f}"),
            ("replies / ep", "episode_length", "{:.2f}"),
            ("success", "success_rate", "{:.2f}"), ("first context tok (max)",
                                                    "prompt_tokens_max", "{}"),
            ("budget", "max_tokens", "{}")]


_IMAGE_RUN = re.compile(f"(?:{re.escape(IMAGE_PLACEHOLDER)})+")


def _fold_images(text: str) -> str:
    """Each run of image placeholder tokens (hundreds per frame) as one `<image ×N>`."""
    return _IMAGE_RUN.sub(lambda m: f"<image ×{len(m.group(0)) // len(IMAGE_PLACEHOLDER)}>",
                          text)


def render_conversation_report(results: list[TaskValidation], failures: list[str], gate: float,
                           settings: dict[str, Any], tokenizer: Any, examples: int = 2) -> str:
    """Markdown: verdict, the table, how episodes ended, then example conversations exactly as
    the model saw them (the decoded token sequence)."""
    lines = [f"# Prompt validation (chat protocol): {'FAILED' if failures else 'passed'}", ""]
    lines += [f"Gate: every task's first context fits the token budget, and at least {gate:.2f} "
              "of replies have no failed tool call (a reply without a call counts as valid)."]
    lines += [f"- {f}" for f in failures] + [""]
    lines += ["Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), ""]
    head = ["task"] + [c[0] for c in _COLUMNS]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r.task] + ["n/a" if (v := r.metrics[key]) != v else fmt.format(v)
                            for _, key, fmt in _COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for r in results:
        ended = ", ".join(f"{k.split('/')[1]} {v}" for k, v in r.metrics.items()
                          if k.startswith("termination/") and v)
        checks = ", ".join(f"{k.split('/')[1]} {v}" for k, v in r.metrics.items()
                           if k.startswith("tokenization/") and v)
        lines += [f"## {r.task}", "", f"Episodes ended: {ended}. Tokenization check: {checks}.",
                  ""]
        for sample in r.samples[:examples]:
            reward = sum(reply["reward"] or 0.0 for reply in sample["replies"])
            calls = ("" if sample["tool_calls"] is None else  # a slime Sample's: not counted
                     f", {sample['tool_calls']} tool call(s), {sample['tool_errors']} failed")
            lines += [f"Seed {sample['episode_seed']}: {ending(sample)}, reward "
                      f"{reward:.2f}{calls}", ""]
            ids = [*sample["prompt_ids"], *sample["response_ids"]]
            lines += fence(_fold_images(tokenizer.decode(ids))) + [""]
    return "\n".join(lines)
