"""Two 13x9 rooms split by a wall (SPEC_babaisai.md §7.3-7.5): family B, `env/two_room-*`
goto/make; families C and D, become another object or make the wall win.

Naming trap kept from the source: tasks *without* `break_stop` start with WALL IS STOP broken.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from longturn.envs.babaisai.grid import Grid
from longturn.envs.babaisai.objects import block
from longturn.envs.babaisai.placement import (
    Cell, Level, choose, divider, draw_names, horizontal, move_top, place_thing, plan, put_rule,
    random_free_cell, region,
)

WIDTH, HEIGHT, DIVIDER_X = 13, 9, 6
LEFT_PUSHABLE = region(range(2, 6), range(3, 6))
RIGHT_PUSHABLE = region(range(7, 11), range(3, 6))
NARROW_LEFT_PUSHABLE = region(range(2, 5), range(3, 6))  # families C and D
NARROW_RIGHT_PUSHABLE = region(range(8, 11), range(3, 6))
LEFT_ANYWHERE = region(range(1, 5), range(1, 8))
RIGHT_ANYWHERE = region(range(7, 11), range(2, 8))
ANYWHERE = [c for c in region(range(1, 12), range(2, 8)) if c[0] != DIVIDER_X]
RIGHT_UNPUSHABLE = [(11, 2), (11, 3), (11, 4), (11, 5), (11, 6), (11, 7), (10, 7), (9, 7), (8, 7)]
REGIONS: dict[str, list[Cell]] = {
    "left_anywhere": LEFT_ANYWHERE, "right_anywhere": RIGHT_ANYWHERE, "anywhere": ANYWHERE,
}
STOP_RULE_CELLS = horizontal(1, 2)
WIN_RULE_CELLS = horizontal(9, 1)


@dataclass(frozen=True)
class TwoRoomOptions:
    stop_broken: bool
    make_win: bool
    object_region: str  # key of REGIONS
    distractor_object: bool = False
    distractor_noun: str | None = None  # None, "obj2" or "obj3"
    distractor_win_rule: bool = False


def generate_two_room(task: str, rng: np.random.Generator, options: TwoRoomOptions) -> Level:
    obj1, obj2, obj3 = draw_names(rng)
    grid = Grid.with_border(WIDTH, HEIGHT)
    divider(grid, DIVIDER_X)
    put_rule(grid, ("baba", "is", "you"), horizontal(1, 7))
    put_rule(grid, ("wall", "is", "stop"), STOP_RULE_CELLS)
    put_rule(grid, (obj1, "is", "win"), WIN_RULE_CELLS)
    if options.distractor_noun == "obj3":
        grid.put(*random_free_cell(rng, grid, RIGHT_PUSHABLE), block(obj3))
    elif options.distractor_noun == "obj2" and options.distractor_object:
        grid.put(*choose(rng, RIGHT_UNPUSHABLE), block(obj2))
    elif options.distractor_noun == "obj2":
        grid.put(*random_free_cell(rng, grid, RIGHT_PUSHABLE), block(obj2))
    if options.stop_broken:
        broken = STOP_RULE_CELLS[1 + int(rng.integers(2))]
        move_top(grid, broken, random_free_cell(rng, grid, LEFT_PUSHABLE))
    if options.make_win:
        move_top(grid, WIN_RULE_CELLS[0], random_free_cell(rng, grid, RIGHT_PUSHABLE))
    place_thing(rng, grid, "baba", LEFT_PUSHABLE)
    target = place_thing(rng, grid, obj1, REGIONS[options.object_region])
    if options.distractor_object:
        place_thing(rng, grid, obj2, REGIONS[options.object_region])
    if options.distractor_win_rule:
        put_rule(grid, (obj3, "is", "win"), horizontal(9, 4))
    needs_break = not options.stop_broken and target[0] > DIVIDER_X
    steps = (["break[wall is stop]"] if needs_break else []) + (
        [f"make[{obj1} is win]"] if options.make_win else []) + [f"goto[{obj1}]"]
    return Level(task, grid, plan(*steps), obj1, obj2, obj3)


def generate_make_you(task: str, rng: np.random.Generator, make_win: bool) -> Level:
    """`two_room-make_you(-make_win)`: make `obj2 IS YOU` to steer the obj2 thing past the wall."""
    obj1, obj2, obj3 = draw_names(rng)
    grid = Grid.with_border(WIDTH, HEIGHT)
    divider(grid, DIVIDER_X)
    put_rule(grid, ("baba", "is", "you"), horizontal(1, 6))
    put_rule(grid, ("wall", "is", "stop"), horizontal(1, 1))
    put_rule(grid, (obj1, "is", "win"), WIN_RULE_CELLS)
    grid.put(*random_free_cell(rng, grid, NARROW_LEFT_PUSHABLE), block(obj2))
    if make_win:
        move_top(grid, WIN_RULE_CELLS[0], random_free_cell(rng, grid, NARROW_RIGHT_PUSHABLE))
    place_thing(rng, grid, "baba", NARROW_LEFT_PUSHABLE)
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
    grid.put(*random_free_cell(rng, grid, NARROW_RIGHT_PUSHABLE), block(obj3))
    place_thing(rng, grid, "baba", NARROW_LEFT_PUSHABLE)
    place_thing(rng, grid, obj1, RIGHT_ANYWHERE)
    place_thing(rng, grid, obj2, RIGHT_ANYWHERE)
    steps = ("break[wall is stop]", "make[wall is win]", "goto[wall]")
    return Level(task, grid, plan(*steps), obj1, obj2, obj3)
