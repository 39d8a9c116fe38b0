"""Grids written as text, in the notation of the spec's worked examples (tests, custom levels).

Each row is whitespace-separated tokens: `#` border, `.` empty, lower case = thing (`w` = wall
thing), UPPER CASE = text block. `+` joins a stack bottom->top, e.g. `door+baba`.
"""

from __future__ import annotations

from longturn.envs.babaisai.grid import Grid
from longturn.envs.babaisai.objects import WorldObject, block, border, thing

_ALIASES = {"w": "wall"}


def parse_token(token: str) -> list[WorldObject]:
    """The stack (bottom->top) one token stands for."""
    if token == ".":
        return []
    stack = []
    for part in token.split("+"):
        if part == "#":
            stack.append(border())
        elif part.isupper():
            stack.append(block(part.lower()))
        else:
            stack.append(thing(_ALIASES.get(part, part)))
    return stack


def grid_from_rows(rows: list[str]) -> Grid:
    """Build a grid from equal-length token rows (row 0 first)."""
    table = [row.split() for row in rows]
    widths = {len(r) for r in table}
    if len(widths) != 1:
        raise ValueError(f"rows have different lengths: {sorted(widths)}")
    grid = Grid(widths.pop(), len(table))
    for y, row in enumerate(table):
        for x, token in enumerate(row):
            for obj in parse_token(token):
                grid.put(x, y, obj)
    return grid


def grid_to_rows(grid: Grid) -> list[str]:
    """The inverse of `grid_from_rows` (stacks joined with `+`)."""
    rows = []
    for y in range(grid.height):
        tokens = ["+".join(o.key for o in grid.stack(x, y)) or "." for x in range(grid.width)]
        rows.append(" ".join(tokens))
    return rows
