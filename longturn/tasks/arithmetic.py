"""Arithmetic word problems generated from a seed, a rule-based reward, and a user who asks for a
revision when the answer is wrong: the shipped task of the chat protocol, needing no download.

Each problem is two or three operations on two- and three-digit numbers wrapped in a short story,
with an integer answer; a small model gets them right far more often with the calculator tool
than without, which is what training should discover. The model is asked to end with
`ANSWER: <number>`; the reward is 1 when the last such line holds the right number, else 0.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from longturn.tasks.interactions import BaseInteraction

SYSTEM = ("You solve arithmetic word problems. You may use the calculator tool for any "
          "computation. When you know the result, end your reply with a line "
          "'ANSWER: <number>'.")
_ANSWER = re.compile(r"answer\s*:\s*\$?\s*(-?[\d,]*\.?\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Problem:
    question: str
    answer: int
    expression: str  # the computation, for audits


def make_problem(seed: int) -> Problem:
    """The problem of one seed (the same on every machine: `random.Random(seed)`): one story
    template, its numbers drawn first."""
    r = random.Random(seed)
    name = r.choice(["Maya", "Omar", "Lena", "Ravi", "Ines", "Tariq", "Yuki", "Bram"])
    a, b, c = r.randint(12, 480), r.randint(3, 29), r.randint(11, 99)
    d = r.randint(2, 9)
    per, groups = r.randint(12, 96), r.randint(3, 24)
    total = per * groups
    return r.choice([
        Problem(f"{name} has {a} stamps and buys {b} packs of {c} stamps each. How many stamps "
                f"does {name} have now?", a + b * c, f"{a} + {b} * {c}"),
        Problem(f"A library had {a + b * c} books and lent out {b} boxes of {c} books each. How "
                "many books are left?", a, f"{a + b * c} - {b} * {c}"),
        Problem(f"{name} packs {total} apples into crates of {per}. Each crate sells for {d} "
                "coins. How many coins do all the crates bring?", groups * d,
                f"{total} / {per} * {d}"),
        Problem(f"A train carries {b} cars with {c} seats each; {a % (b * c) or 1} seats are "
                "empty. How many seats are taken?", b * c - (a % (b * c) or 1),
                f"{b} * {c} - {a % (b * c) or 1}"),
        Problem(f"{name} saves {c} coins a week for {b} weeks, then spends {a % (b * c)} coins. "
                "How many coins are left?", b * c - a % (b * c), f"{c} * {b} - {a % (b * c)}"),
    ])


# A worked exchange shown before the problem: one calculator call, its result, the answer line.
# A 135M model imitates formats it has seen far more readily than it follows a description.
DEMONSTRATION = [
    {"role": "user", "content": "Ana has 12 boxes of 24 pencils and gives away 35 pencils. How "
                                "many pencils are left?"},
    {"role": "assistant", "content": '<tool_call>\n{"name": "calculator", "arguments": '
                                     '{"expression": "12 * 24 - 35"}}\n</tool_call>'},
    {"role": "tool", "name": "calculator", "content": "253"},
    {"role": "assistant", "content": "12 boxes of 24 pencils are 288 pencils, and 288 - 35 = "
                                     "253.\nANSWER: 253"},
]


def task_record(seed: int, demonstration: bool = False) -> dict[str, Any]:
    """One task for the conversation rollout: its first messages (with `demonstration`, the worked
    exchange before the problem) and what the tools and the interaction need to know."""
    problem = make_problem(seed)
    example = [dict(m) for m in DEMONSTRATION] if demonstration else []
    return {"task": "arithmetic", "seed": seed, "answer": problem.answer,
            "messages": [{"role": "system", "content": SYSTEM}, *example,
                         {"role": "user", "content": problem.question}],
            "tools_kwargs": {}, "interaction_kwargs": {"answer": problem.answer}}


def final_answer(text: str) -> float | None:
    """The number on the reply's last `ANSWER:` line (commas allowed), or None. `_ANSWER` only
    matches digits around at most one dot, which `float` always reads."""
    found = _ANSWER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def reward(text: str, answer: int) -> float:
    value = final_answer(text)
    return 1.0 if value is not None and abs(value - answer) < 1e-6 else 0.0


class RevisionInteraction(BaseInteraction):
    """Ends the episode on a right answer (score 1); on a wrong or missing one asks for a
    revision, up to `max_revisions` times (config), then ends it (score 0)."""

    def start(self, instance_id: str, **kwargs: Any) -> None:
        super().start(instance_id, **kwargs)
        self.instances[instance_id]["revisions"] = 0

    def generate_response(self, instance_id: str, messages: list[dict[str, Any]]
                          ) -> tuple[bool, str, float, dict[str, Any]]:
        state = self.instances[instance_id]
        score = reward(messages[-1]["content"], state["answer"])
        if score == 1.0:
            return True, "Correct.", 1.0, {"revisions": state["revisions"]}
        if state["revisions"] >= int(self.config.get("max_revisions", 1)):
            return True, "That is still not right.", 0.0, {"revisions": state["revisions"]}
        state["revisions"] += 1
        missing = final_answer(messages[-1]["content"]) is None
        text = ("I do not see an 'ANSWER: <number>' line. " if missing else
                "That answer is not right. ") + "Check the computation and answer again."
        return False, text, 0.0, {"revisions": state["revisions"]}


class ArithmeticTask:
    """The task as the chat protocol loads it (`env.tasks: [arithmetic]`,
    longturn/tasks/registry.py): a task record per seed, and the rule-based reward and success of
    a finished conversation."""

    def __init__(self, demonstration: bool = True):
        self.demonstration = demonstration

    def record(self, seed: int) -> dict[str, Any]:
        return task_record(seed, self.demonstration)

    def reward(self, task: dict[str, Any], messages: list[dict[str, Any]]) -> float:
        """1 when the last assistant message's `ANSWER:` holds the right number."""
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        return reward(replies[-1], int(task["answer"])) if replies else 0.0

    def success(self, task: dict[str, Any], messages: list[dict[str, Any]]) -> bool:
        return self.reward(task, messages) >= 1.0


TASK = ArithmeticTask()  # `arithmetic`: the problem after the worked exchange
PLAIN = ArithmeticTask(demonstration=False)  # `arithmetic_plain`: the problem alone
