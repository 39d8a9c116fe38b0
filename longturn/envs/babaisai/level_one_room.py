"""Family A (SPEC_babaisai.md §7.2): one 8x8 room, `env/goto_win*` and `env/make_win*`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from longturn.envs.babaisai.grid import Grid
from longturn.envs.babaisai.objects import block
from longturn.envs.babaisai.placement import (
    Level, draw_names, choose, horizontal, move_top, place_thing, plan, put_rule,
    random_free_cell, region,
)

SIZE = 8
# Edge spots of the distractor noun (duplicates on purpose: the original's list).
DISTRACTOR_NOUN_CELLS = [
    (4, 6), (5, 6), (6, 6), (4, 1), (5, 1), (6, 1), (6, 1), (6, 2), (6, 3), (6, 4), (6, 5), (6, 6),
]
NOUN_TARGETS = region(range(2, 6), range(2, 6))
THING_CELLS = region(range(1, 7), range(2, 7))


@dataclass(frozen=True)
class OneRoomOptions:
    make_win: bool = False
    distractor_object: bool = False
    distractor_noun: str | None = None  # None, "obj2" or "obj3"


def generate_one_room(task: str, rng: np.random.Generator, options: OneRoomOptions) -> Level:
    obj1, obj2, obj3 = draw_names(rng)
    grid = Grid.with_border(SIZE, SIZE)
    put_rule(grid, ("baba", "is", "you"), horizontal(1, 6))
    put_rule(grid, (obj1, "is", "win"), horizontal(1, 1))
    if options.make_win:
        move_top(grid, (1, 1), random_free_cell(rng, grid, NOUN_TARGETS))
    if options.distractor_noun is not None:
        word = obj3 if options.distractor_noun == "obj3" else obj2
        grid.put(*choose(rng, DISTRACTOR_NOUN_CELLS), block(word))
    place_thing(rng, grid, "baba", THING_CELLS)
    place_thing(rng, grid, obj1, THING_CELLS)
    if options.distractor_object:
        place_thing(rng, grid, obj2, THING_CELLS)
    steps = ([f"make[{obj1} is win]"] if options.make_win else []) + [f"goto[{obj1}]"]
    return Level(task, grid, plan(*steps), obj1, obj2, obj3)
