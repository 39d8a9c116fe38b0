"""The 40 BALROG/Verlog BabaIsAI task ids and the generator behind each (SPEC_babaisai.md §7.6)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from longturn.envs.babaisai.level_one_room import OneRoomOptions, generate_one_room
from longturn.envs.babaisai.level_two_room import (
    TwoRoomOptions, generate_make_wall_win, generate_make_you, generate_two_room,
)
from longturn.envs.babaisai.placement import Level

Generator = Callable[[str, np.random.Generator], Level]  # (task, rng) -> a new level of the task

# suffix -> (distractor object, distractor noun word, distractor WIN rule)
_DISTRACTORS: dict[str, tuple[bool, str | None, bool]] = {
    "": (False, None, False),
    "-distr_obj": (True, None, False),
    "-distr_rule": (False, "obj2", False),
    "-distr_obj_rule": (True, "obj2", False),
    "-distr_obj-irrelevant_rule": (True, "obj3", False),
    "-distr_win_rule": (True, "obj2", True),
}
_COMMON_SUFFIXES = [s for s in _DISTRACTORS if s != "-distr_win_rule"]

# two-room prefix -> (stop broken at start, make_win, object region)
_TWO_ROOM_KINDS: dict[str, tuple[bool, bool, str]] = {
    "two_room-goto_win": (True, False, "left_anywhere"),
    "two_room-break_stop-goto_win": (False, False, "right_anywhere"),
    "two_room-maybe_break_stop-goto_win": (False, False, "anywhere"),
    "two_room-make_win": (True, True, "left_anywhere"),
    "two_room-break_stop-make_win": (False, True, "right_anywhere"),
}
_WITH_WIN_RULE_DISTRACTOR = ("two_room-goto_win", "two_room-make_win")


def _one_room_tasks() -> dict[str, Generator]:
    tasks: dict[str, Generator] = {}
    for kind in ("goto_win", "make_win"):
        for suffix in _COMMON_SUFFIXES:
            obj, noun, _ = _DISTRACTORS[suffix]
            options = OneRoomOptions(kind == "make_win", obj, noun)
            tasks[f"env/{kind}{suffix}"] = partial(generate_one_room, options=options)
    return tasks


def _two_room_tasks() -> dict[str, Generator]:
    tasks: dict[str, Generator] = {}
    for prefix, (stop_broken, make_win, where) in _TWO_ROOM_KINDS.items():
        extra = ["-distr_win_rule"] if prefix in _WITH_WIN_RULE_DISTRACTOR else []
        for suffix in _COMMON_SUFFIXES + extra:
            obj, noun, win_rule = _DISTRACTORS[suffix]
            options = TwoRoomOptions(stop_broken, make_win, where, obj, noun, win_rule)
            tasks[f"env/{prefix}{suffix}"] = partial(generate_two_room, options=options)
    return tasks


_SPECIAL_TASKS: dict[str, Generator] = {
    "env/two_room-make_you": partial(generate_make_you, make_win=False),
    "env/two_room-make_you-make_win": partial(generate_make_you, make_win=True),
    "env/two_room-make_wall_win": generate_make_wall_win,
}
GENERATORS: dict[str, Generator] = {**_one_room_tasks(), **_two_room_tasks(), **_SPECIAL_TASKS}
TASKS: tuple[str, ...] = tuple(GENERATORS)


def generate_level(task: str, rng: np.random.Generator) -> Level:
    """A new random level of `task` (one of TASKS, as the env checks) drawn from `rng`."""
    return GENERATORS[task](task, rng)
