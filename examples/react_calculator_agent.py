"""A ReAct-style agent for longturn's arithmetic problems, written against the `openai` client
alone: think, call the calculator, read its result, answer with an `ANSWER: <number>` line.

longturn hands it a task and the base URL of the policy it trains; every call the agent makes is
recorded there and becomes a training sample. Train it with the `agent` profile:
`make params PROFILE=agent && .venv/bin/dvc exp run -n agent` (docs/openai-endpoint.md).
"""

from __future__ import annotations

import ast
import json
import operator

from openai import OpenAI

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression with + - * / ( ).",
    "parameters": {"type": "object", "required": ["expression"],
                   "properties": {"expression": {"type": "string"}}}}}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
             ast.Div: operator.truediv, ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """The value of + - * / over numbers, or an error message (nothing else is evaluated)."""
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ( )")
    try:
        return f"{value(ast.parse(str(expression)[:200], mode='eval').body):g}"
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError) as err:
        return f"Error: {err}"


def agent(task: dict, base_url: str, max_calls: int = 4) -> float | None:
    """Play one problem; None leaves the reward to the task (1 for the right ANSWER)."""
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    messages = list(task["messages"])
    for _ in range(max_calls):
        reply = client.chat.completions.create(model="policy", messages=messages,
                                               tools=[CALCULATOR]).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            expression = json.loads(call.function.arguments).get("expression", "")
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": calculate(expression)})
    return None
