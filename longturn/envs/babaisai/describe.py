"""The text observation BALROG/Verlog models read (SPEC_babaisai.md §5), quirks included.

Distances are relative to the YOU thing; left/up distances always say "step" (original wording),
`baba` things and buried objects are never listed, and the reference thing lists itself as "".
"""

from __future__ import annotations

from longturn.envs.babaisai.grid import Grid
from longturn.envs.babaisai.rules import RuleSet

LISTED_THINGS = ("ball", "wall", "door", "key")


def rule_lines(rules: RuleSet) -> list[str]:
    """`noun is property`, one per property rule in parse order (replacement rules hidden)."""
    return [f"{noun} is {prop}" for noun, prop in rules.pairs()]


def reference_cell(grid: Grid, rules: RuleSet) -> tuple[int, int] | None:
    """First cell whose top is a thing named by the LAST `... is you` rule; None if YOU is lost."""
    you_nouns = [noun for noun, prop in rules.pairs() if prop == "you"]
    if not you_nouns:
        return None
    for x, y in grid.positions():
        top = grid.top(x, y)
        if top is not None and top.is_thing and top.name == you_nouns[-1]:
            return x, y
    return None


def relative_position(dx: int, dy: int) -> str:
    """e.g. `2 steps to the right and 1 step up`; "" for the reference cell itself."""
    parts = []
    if dx > 0:
        parts.append(f"{dx} {'steps' if dx > 1 else 'step'} to the right")
    elif dx < 0:
        parts.append(f"{-dx} step to the left")
    if dy > 0:
        parts.append(f"{dy} {'steps' if dy > 1 else 'step'} down")
    elif dy < 0:
        parts.append(f"{-dy} step up")
    return " and ".join(parts)


def object_lines(grid: Grid, reference: tuple[int, int]) -> list[str]:
    """One line per listed top object, row-major, positioned relative to `reference`."""
    lines = []
    for x, y in grid.positions():
        top = grid.top(x, y)
        if top is None:
            continue
        if top.is_block:
            label = f"rule `{top.name}`"
        elif top.is_thing and top.name in LISTED_THINGS:
            label = top.name
        else:
            continue
        where = relative_position(x - reference[0], y - reference[1])
        lines.append(f"{label} {where}" if where else "")
    return lines


def observation_text(grid: Grid, rules: RuleSet, add_ruleset: bool = True) -> str | None:
    """The full `Active rules: ... Objects on the map: ...` text; None when no YOU thing exists."""
    reference = reference_cell(grid, rules)
    if reference is None:
        return None
    objects = "Objects on the map:\n" + "\n".join(object_lines(grid, reference))
    if not add_ruleset:
        return objects
    return "Active rules:\n" + "\n".join(rule_lines(rules)) + "\n\n" + objects
