"""Level-building helpers: regions, random free cells, rule placement (SPEC_babaisai.md §7.1).

All randomness comes from the numpy Generator passed in, so a level is a function of its seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from longturn.envs.babaisai.grid import Grid
from longturn.envs.babaisai.objects import block, thing

Cell = tuple[int, int]
WIN_OBJECT_NAMES: tuple[str, ...] = ("ball", "key", "door")


@dataclass(frozen=True)
class Level:
    """A freshly generated level: its grid plus what the generator meant (stats and solvers)."""

    task: str
    grid: Grid
    target_plan: str
    win_object: str  # obj1
    distractor_object: str  # obj2
    irrelevant_object: str  # obj3


def region(xs: range, ys: range) -> list[Cell]:
    """Cells of a rectangle, row-major."""
    return [(x, y) for y in ys for x in xs]


def draw_names(rng: np.random.Generator) -> tuple[str, str, str]:
    """(obj1 = WIN object, obj2 = distractor, obj3 = irrelevant): ball/key/door in random order."""
    order = rng.permutation(len(WIN_OBJECT_NAMES))
    a, b, c = (WIN_OBJECT_NAMES[int(i)] for i in order)
    return a, b, c


def choose(rng: np.random.Generator, cells: list[Cell]) -> Cell:
    """A uniform pick from `cells` (duplicates count twice)."""
    return cells[int(rng.integers(len(cells)))]


def random_free_cell(rng: np.random.Generator, grid: Grid, cells: list[Cell]) -> Cell:
    """Uniform over the cells of `cells` that are empty right now."""
    free = [c for c in cells if grid.is_empty(*c)]
    if not free:
        raise RuntimeError(f"no free cell in region {cells}")
    return choose(rng, free)


def put_rule(grid: Grid, words: tuple[str, str, str], cells: list[Cell]) -> None:
    """Three blocks at exactly these cells (stacked on whatever is there)."""
    for word, (x, y) in zip(words, cells):
        grid.put(x, y, block(word))


def horizontal(x: int, y: int) -> list[Cell]:
    return [(x, y), (x + 1, y), (x + 2, y)]


def move_top(grid: Grid, source: Cell, target: Cell) -> None:
    """Relocate the top object of `source` onto `target` ("break rule X, block k, to R")."""
    grid.put(*target, grid.pop(*source))


def place_thing(rng: np.random.Generator, grid: Grid, name: str, cells: list[Cell]) -> Cell:
    cell = random_free_cell(rng, grid, cells)
    grid.put(*cell, thing(name))
    return cell


def divider(grid: Grid, x: int) -> None:
    """The column of `wall` things splitting two rooms (passable once WALL IS STOP is gone)."""
    for y in range(1, grid.height - 1):
        grid.put(x, y, thing("wall"))


def plan(*steps: str) -> str:
    """target_plan text, e.g. `break[wall is stop], goto[ball]`."""
    return ", ".join(steps)
