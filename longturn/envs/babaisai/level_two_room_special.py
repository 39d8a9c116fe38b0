"""Families C and D (SPEC_babaisai.md §7.4-7.5): become another object, or make the wall win."""

from __future__ import annotations

import numpy as np

from longturn.envs.babaisai.grid import Grid
from longturn.envs.babaisai.objects import block
from longturn.envs.babaisai.placement import (
    Level, choose, divider, draw_names, horizontal, move_top, place_thing, plan, put_rule,
    random_free_cell, region,
)
from longturn.envs.babaisai.level_two_room import (
    DIVIDER_X, HEIGHT, RIGHT_ANYWHERE, RIGHT_UNPUSHABLE, WIDTH, WIN_RULE_CELLS,
)

LEFT_PUSHABLE = region(range(2, 5), range(3, 6))
RIGHT_PUSHABLE = region(range(8, 11), range(3, 6))


def generate_make_you(task: str, rng: np.random.Generator, make_win: bool) -> Level:
    """`two_room-make_you(-make_win)`: make `obj2 IS YOU` to steer the obj2 thing past the wall."""
    obj1, obj2, obj3 = draw_names(rng)
    grid = Grid.with_border(WIDTH, HEIGHT)
    divider(grid, DIVIDER_X)
    put_rule(grid, ("baba", "is", "you"), horizontal(1, 6))
    put_rule(grid, ("wall", "is", "stop"), horizontal(1, 1))
    put_rule(grid, (obj1, "is", "win"), WIN_RULE_CELLS)
    grid.put(*random_free_cell(rng, grid, LEFT_PUSHABLE), block(obj2))
    if make_win:
        move_top(grid, WIN_RULE_CELLS[0], random_free_cell(rng, grid, RIGHT_PUSHABLE))
    place_thing(rng, grid, "baba", LEFT_PUSHABLE)
    place_thing(rng, grid, obj1, RIGHT_ANYWHERE)
    place_thing(rng, grid, obj2, RIGHT_ANYWHERE)
    steps = [f"make[{obj2} is you]"] + ([f"make[{obj1} is win]"] if make_win else [])
    return Level(task, grid, plan(*steps, f"goto[{obj1}]"), obj1, obj2, obj3)


def generate_make_wall_win(task: str, rng: np.random.Generator) -> Level:
    """`two_room-make_wall_win`: obj1's noun is out of reach, so the wall itself must become WIN."""
    obj1, obj2, obj3 = draw_names(rng)
    grid = Grid.with_border(WIDTH, HEIGHT)
    divider(grid, DIVIDER_X)
    put_rule(grid, ("baba", "is", "you"), horizontal(1, 7))
    put_rule(grid, ("wall", "is", "stop"), horizontal(2, 2))
    put_rule(grid, (obj1, "is", "win"), WIN_RULE_CELLS)
    move_top(grid, WIN_RULE_CELLS[0], choose(rng, RIGHT_UNPUSHABLE))
    grid.put(*random_free_cell(rng, grid, RIGHT_PUSHABLE), block(obj3))
    place_thing(rng, grid, "baba", LEFT_PUSHABLE)
    place_thing(rng, grid, obj1, RIGHT_ANYWHERE)
    place_thing(rng, grid, obj2, RIGHT_ANYWHERE)
    steps = ("break[wall is stop]", "make[wall is win]", "goto[wall]")
    return Level(task, grid, plan(*steps), obj1, obj2, obj3)
