"""Reading the rules off the grid: `NOUN IS PROPERTY` and `NOUN IS NOUN`, left->right or top->down.

Exact scan of SPEC_babaisai.md §2.1: row-major over IS blocks, horizontal before vertical,
duplicates kept, only top objects count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from longturn.envs.babaisai.grid import Grid
from longturn.envs.babaisai.objects import WorldObject

Cell = tuple[int, int]


@dataclass(frozen=True)
class Rule:
    """One rule and the three cells whose blocks spell it (subject, IS, object)."""

    subject: str
    word: str
    cells: tuple[Cell, Cell, Cell]


@dataclass(frozen=True)
class RuleSet:
    """Property rules (shown to the agent) and replacement rules (hidden), in parse order."""

    properties: tuple[Rule, ...] = ()
    replacements: tuple[Rule, ...] = ()
    _lookup: frozenset[tuple[str, str]] = field(default=frozenset(), compare=False, repr=False)

    def has(self, obj: WorldObject | None, prop: str) -> bool:
        """Whether `obj` is a thing with property `prop` (blocks and borders never have any)."""
        return obj is not None and obj.is_thing and (obj.name, prop) in self._lookup

    def pairs(self) -> list[tuple[str, str]]:
        """The property rules as (noun, property), in parse order, duplicates included."""
        return [(r.subject, r.word) for r in self.properties]

    def replacement_pairs(self) -> list[tuple[str, str]]:
        return [(r.subject, r.word) for r in self.replacements]


def parse_rules(grid: Grid) -> RuleSet:
    """All rules currently spelled on `grid`."""
    properties: list[Rule] = []
    replacements: list[Rule] = []
    for x, y in grid.positions():
        top = grid.top(x, y)
        if top is None or not top.is_is_block:
            continue
        if 0 <= x - 1 and x + 1 < grid.width:
            _try_rule(grid, (x - 1, y), (x, y), (x + 1, y), properties, replacements)
        if 0 <= y - 1 and y + 1 < grid.height:
            _try_rule(grid, (x, y - 1), (x, y), (x, y + 1), properties, replacements)
    lookup = frozenset((r.subject, r.word) for r in properties)
    return RuleSet(tuple(properties), tuple(replacements), lookup)


def _try_rule(
    grid: Grid, before: Cell, middle: Cell, after: Cell,
    properties: list[Rule], replacements: list[Rule],
) -> None:
    subject, obj = grid.top(*before), grid.top(*after)
    if subject is None or obj is None or not subject.is_noun_block:
        return
    if obj.is_property_block:
        properties.append(Rule(subject.name, obj.name, (before, middle, after)))
    elif obj.is_noun_block:
        replacements.append(Rule(subject.name, obj.name, (before, middle, after)))
