"""A calculator tool whose input is model text, so it is evaluated without eval().

The expression is parsed with `ast.parse(mode="eval")` and the tree is walked here: numbers,
parentheses, + - * / // % and ** on numbers, unary signs; anything else (names, calls,
attributes, strings, comparisons) is refused with a message. Limits keep a reply from costing
time or memory: the expression's length, the size of exponents and of every intermediate result.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from longturn.errors import SettingError
from longturn.tasks.tools import BaseTool

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculationError(ValueError):
    """The expression is not plain arithmetic, or exceeds a limit; the message says which."""


def evaluate(expression: str, max_length: int = 200, max_exponent: int = 64,
             max_magnitude: float = 1e15) -> int | float:
    """The value of an arithmetic expression, or CalculationError."""
    if len(expression) > max_length:
        raise CalculationError(f"the expression is longer than {max_length} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculationError(f"{expression!r} is not an arithmetic expression") from None

    def walk(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            value = node.value
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            value = _UNARY[type(node.op)](walk(node.operand))
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > max_exponent:
                raise CalculationError(f"exponents above {max_exponent} are not allowed")
            try:
                value = _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise CalculationError("division by zero") from None
        else:
            raise CalculationError(
                f"only numbers and + - * / // % ** ( ) are allowed, not "
                f"{ast.get_source_segment(expression.strip(), node) or type(node).__name__!r}")
        if isinstance(value, complex) or not math.isfinite(value) or abs(value) > max_magnitude:
            raise CalculationError(f"a value is out of range (limit {max_magnitude:g})")
        return value

    return walk(tree)


def format_number(value: int | float) -> str:
    """Integers as integers (6.0 → 6), other values to 10 significant digits."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.10g}"


class CalculatorTool(BaseTool):
    """`calculator(expression)`: the value of an arithmetic expression, or what is wrong with it.
    Config: max_length, max_exponent, max_magnitude (the limits of `evaluate`)."""

    LIMITS = ("max_length", "max_exponent", "max_magnitude")

    def __init__(self, config: dict[str, Any], schema: dict[str, Any]):
        super().__init__(config, schema)
        unknown = sorted(set(self.config) - set(self.LIMITS))
        if unknown:
            raise SettingError(f"calculator config: unknown keys {unknown}; it takes "
                               f"{', '.join(self.LIMITS)}")
        try:
            self.limits = {k: float(v) for k, v in self.config.items()}
        except (TypeError, ValueError):
            raise SettingError(f"calculator config: limits must be numbers, got "
                               f"{self.config}") from None

    def execute(self, instance_id: str, parameters: dict[str, Any]
                ) -> tuple[str, float, dict[str, Any]]:
        try:
            value = evaluate(str(parameters["expression"]), **self.limits)
        except CalculationError as err:
            return f"Error: {err}", 0.0, {"calculator_ok": 0}
        return format_number(value), 0.0, {"calculator_ok": 1}
