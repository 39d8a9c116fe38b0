"""The arithmetic word problems (tasks/arithmetic.py) in GSM8K's answer format and with verl's
per-row kwargs: the built-in task on which verl's own GSM8K tool and interaction
(`verl/tools/gsm8k_tool.py`, `verl/interactions/gsm8k_interaction.py`, import lines changed)
run with no dataset download.

A record carries what a row of verl's GSM8K multi-turn data carries (its
`examples/data_preprocess/gsm8k_multiturn_w_tool.py`; docs/conversations.md shows one). The model
is asked to end with `#### <number>`; the reward without an interaction is verl's strict GSM8K
score of the last reply.
"""

from __future__ import annotations

from typing import Any

from longturn.tasks import gsm8k_score
from longturn.tasks.arithmetic import ArithmeticTask, make_problem

TOOL = "calc_gsm8k_reward"  # the tool's name in verl's gsm8k_tool_config.yaml
INTERACTION = "gsm8k"       # the interaction's name in verl's gsm8k_interaction_config.yaml
SYSTEM = ("You solve math word problems step by step. Before your final answer, check it at "
          f"least once with the {TOOL} tool, and revise it if the tool or the user says it is "
          "wrong. End your final reply with a line '#### <answer>'.")
ASK = " Think step by step and write the final answer after '####'."

# A worked exchange before the problem: reasoning, one check with the tool, the `####` line.
DEMONSTRATION = [
    {"role": "user", "content": "Ana has 12 boxes of 24 pencils and gives away 35 pencils. How "
                                "many pencils are left?" + ASK},
    {"role": "assistant", "content": "12 boxes of 24 pencils are 288 pencils, and 288 - 35 = 253."
                                     f'\n<tool_call>\n{{"name": "{TOOL}", "arguments": '
                                     '{"answer": "253"}}\n</tool_call>'},
    {"role": "tool", "name": TOOL, "content": "Current parsed answer='253' reward=1.0"},
    {"role": "assistant", "content": "The check confirms it.\n#### 253"},
]


def task_record(seed: int, demonstration: bool = True) -> dict[str, Any]:
    """One task in verl's row shape: first messages, ground truth, tools and interaction kwargs."""
    problem = make_problem(seed)
    truth = str(problem.answer)  # verl compares answers as text
    question = problem.question + ASK
    example = [dict(m) for m in DEMONSTRATION] if demonstration else []
    return {"task": "arithmetic_gsm8k", "seed": seed, "answer": problem.answer,
            "ground_truth": truth,
            "messages": [{"role": "system", "content": SYSTEM}, *example,
                         {"role": "user", "content": question}],
            "tools_kwargs": {TOOL: {"create_kwargs": {"ground_truth": truth}}},
            "interaction_kwargs": {"name": INTERACTION, "query": question,
                                   "ground_truth": truth}}


class ArithmeticGsm8kTask(ArithmeticTask):
    """`env.tasks: [arithmetic_gsm8k]` (longturn/tasks/registry.py): records per seed, and verl's
    strict GSM8K score of the last reply as reward and success."""

    def record(self, seed: int) -> dict[str, Any]:
        return task_record(seed, self.demonstration)

    def reward(self, task: dict[str, Any], messages: list[dict[str, Any]]) -> float:
        """The last reply's score; the worked exchange's `#### 253` is not the model's."""
        played = messages[len(task["messages"]):]
        replies = [m["content"] for m in played if m["role"] == "assistant"]
        return (float(gsm8k_score.compute_score(replies[-1], task["ground_truth"]))
                if replies else 0.0)


TASK = ArithmeticGsm8kTask()
