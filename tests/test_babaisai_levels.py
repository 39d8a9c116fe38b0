"""Level generators (SPEC_babaisai.md §7): the 40 task ids, layouts per family, and solvability."""

from __future__ import annotations

import numpy as np
import pytest

from longturn.envs.babaisai import TASKS, BabaIsAITextEnv
from longturn.envs.babaisai.game import BabaGame
from longturn.envs.babaisai.levels import generate_level
from longturn.envs.babaisai.level_one_room import DISTRACTOR_NOUN_CELLS
from longturn.envs.babaisai.level_two_room import RIGHT_UNPUSHABLE
from longturn.envs.babaisai.placement import Level
from babaisai_solver import parse_plan, solve

SPEC_TASKS = [f"env/{k}{s}" for k in ("goto_win", "make_win") for s in (
    "", "-distr_obj", "-distr_rule", "-distr_obj_rule", "-distr_obj-irrelevant_rule")] + [
    f"env/two_room-{k}{s}" for k in (
        "goto_win", "break_stop-goto_win", "maybe_break_stop-goto_win", "make_win",
        "break_stop-make_win",
    ) for s in ("", "-distr_obj", "-distr_rule", "-distr_obj_rule", "-distr_obj-irrelevant_rule")
] + ["env/two_room-goto_win-distr_win_rule", "env/two_room-make_win-distr_win_rule",
     "env/two_room-make_you", "env/two_room-make_you-make_win", "env/two_room-make_wall_win"]
ONE_ROOM = [t for t in TASKS if "two_room" not in t]
TWO_ROOM = [t for t in TASKS if "two_room" in t and "make_you" not in t and "wall_win" not in t]
SEEDS = range(6)


def _level(task: str, seed: int) -> Level:
    return generate_level(task, np.random.default_rng(seed))


def _tops(level: Level, cells: list[tuple[int, int]]) -> list[str]:
    return [level.grid.top(*c).key if level.grid.top(*c) else "." for c in cells]


def _things(level: Level, name: str) -> list[tuple[int, int]]:
    return level.grid.find(name, "thing")


def _rules(level: Level) -> list[tuple[str, str]]:
    return BabaGame(level.grid.copy()).rules.pairs()


def test_the_forty_task_ids_of_balrog_and_verlog() -> None:
    assert sorted(TASKS) == sorted(SPEC_TASKS) and len(TASKS) == 40


@pytest.mark.parametrize("task", ONE_ROOM)
def test_one_room_layout(task: str) -> None:
    for seed in SEEDS:
        level = _level(task, seed)
        obj1, obj2, obj3 = level.win_object, level.distractor_object, level.irrelevant_object
        assert {obj1, obj2, obj3} == {"ball", "key", "door"}
        assert (level.grid.width, level.grid.height) == (8, 8)
        assert _tops(level, [(1, 6), (2, 6), (3, 6), (2, 1), (3, 1)]) == [
            "BABA", "IS", "YOU", "IS", "WIN"]
        nouns = level.grid.find(obj1, "block")
        if "make_win" in task:
            assert len(nouns) == 1 and 2 <= nouns[0][0] <= 5 and 2 <= nouns[0][1] <= 5
            assert (obj1, "win") not in _rules(level)
            assert level.target_plan == f"make[{obj1} is win], goto[{obj1}]"
        else:
            assert nouns == [(1, 1)] and _rules(level) == [(obj1, "win"), ("baba", "you")]
            assert level.target_plan == f"goto[{obj1}]"
        assert len(_things(level, "baba")) == len(_things(level, obj1)) == 1
        assert len(_things(level, obj2)) == int("distr_obj" in task)
        assert all(y >= 2 for name in ("baba", obj1, obj2) for _, y in _things(level, name))
        distractor = obj3 if "irrelevant" in task else obj2
        placed = level.grid.find(distractor, "block")
        assert len(placed) == int("rule" in task)
        assert all(cell in DISTRACTOR_NOUN_CELLS for cell in placed)


@pytest.mark.parametrize("task", TWO_ROOM)
def test_two_room_layout(task: str) -> None:
    stop_active = "break_stop" in task
    for seed in SEEDS:
        level = _level(task, seed)
        obj1, obj2, obj3 = level.win_object, level.distractor_object, level.irrelevant_object
        assert (level.grid.width, level.grid.height) == (13, 9)
        assert _things(level, "wall") == [(6, y) for y in range(1, 8)]
        assert _tops(level, [(1, 7), (2, 7), (3, 7), (10, 1), (11, 1)]) == [
            "BABA", "IS", "YOU", "IS", "WIN"]
        rules = _rules(level)
        assert (("wall", "stop") in rules) == stop_active
        assert ((obj1, "win") in rules) == ("make_win" not in task)
        assert ("baba", "you") in rules
        assert ((obj3, "win") in rules) == ("distr_win_rule" in task)
        (x, y), = _things(level, obj1)
        if "maybe" not in task:
            assert (x < 6) == ("break_stop" not in task)
        (bx, by), = _things(level, "baba")
        assert 2 <= bx <= 5 and 3 <= by <= 5
        assert len(_things(level, obj2)) == int("distr_obj" in task or "distr_win_rule" in task)
        if "distr_obj_rule" in task or "distr_win_rule" in task:
            assert level.grid.find(obj2, "block")[0] in RIGHT_UNPUSHABLE
        assert [s[0] for s in parse_plan(level.target_plan)][-1] == "goto"
        assert ("break[wall is stop]" in level.target_plan) == (stop_active and x > 6)


def test_stop_rule_is_broken_by_moving_is_or_stop() -> None:
    moved = set()
    for seed in range(20):
        level = _level("env/two_room-goto_win", seed)
        home = {"IS": (2, 2), "STOP": (3, 2)}
        moved.update(word for word, cell in home.items() if level.grid.top(*cell) is None)
        assert _tops(level, [(1, 2)]) == ["WALL"]
    assert moved == {"IS", "STOP"}


def test_make_you_and_make_wall_win_layouts() -> None:
    for seed in SEEDS:
        you = _level("env/two_room-make_you-make_win", seed)
        assert _tops(you, [(1, 6), (2, 6), (3, 6), (1, 1), (2, 1), (3, 1)]) == [
            "BABA", "IS", "YOU", "WALL", "IS", "STOP"]
        (nx, ny), = you.grid.find(you.distractor_object, "block")
        assert 2 <= nx <= 4 and 3 <= ny <= 5
        (wx, wy), = you.grid.find(you.win_object, "block")
        assert 8 <= wx <= 10 and 3 <= wy <= 5
        assert all(x > 6 for name in (you.win_object, you.distractor_object)
                   for x, _ in _things(you, name))
        wall = _level("env/two_room-make_wall_win", seed)
        assert _tops(wall, [(1, 7), (2, 2), (3, 2), (4, 2), (10, 1), (11, 1)]) == [
            "BABA", "WALL", "IS", "STOP", "IS", "WIN"]
        assert wall.grid.find(wall.win_object, "block")[0] in RIGHT_UNPUSHABLE
        assert wall.target_plan == "break[wall is stop], make[wall is win], goto[wall]"


def test_names_are_a_random_permutation() -> None:
    firsts = {_level("env/goto_win", seed).win_object for seed in range(30)}
    assert firsts == {"ball", "key", "door"}


@pytest.mark.parametrize("task", TASKS)
def test_every_task_is_won_by_the_solver_through_the_text_env(task: str) -> None:
    env = BabaIsAITextEnv(task)
    for seed in range(3):
        env.reset(seed=seed)
        actions = solve(env.game, env.level.target_plan)
        assert actions is not None, f"{task} seed {seed}: no solution found"
        names = [env.actions[a] for a in actions]
        for number, name in enumerate(names, start=1):
            obs, reward, terminated, truncated, info = env.step(name)
            assert not info["you_lost_reset"]
            assert terminated == (number == len(names)) and not truncated
        assert info["success"] and reward == 1 - 0.9 * (len(names) / 100)
        assert info["progression"] == 1.0
