"""Worked examples A-G of SPEC_babaisai.md §8, reproduced exactly (text, reward, done)."""

from __future__ import annotations

import pytest

from longturn.envs.babaisai import BabaIsAITextEnv
from babaisai_ascii import grid_from_rows
from longturn.envs.babaisai.describe import observation_text
from longturn.envs.babaisai.env import YOU_LOST_NOTICE
from longturn.envs.babaisai.game import BabaGame
from longturn.envs.babaisai.placement import Level

UP, RIGHT, DOWN, LEFT = 1, 2, 3, 4

EXAMPLE_A = [
    "# #    #  #    # # # #",
    "# DOOR IS WIN  . . . #",
    "# .    .  .    . . . #",
    "# door .  baba . . . #",
    "# .    .  .    . . . #",
    "# .    .  .    . . . #",
    "# BABA IS YOU  . . . #",
    "# #    #  #    # # # #",
]
EXAMPLE_B = [
    "# #    #    #   # #    # #",
    "# .    IS   WIN . .    . #",
    "# baba .    .   . .    . #",
    "# .    BALL .   . ball . #",
    "# .    .    .   . .    . #",
    "# .    .    .   . .    . #",
    "# BABA IS   YOU . .    . #",
    "# #    #    #   # #    # #",
]
EXAMPLE_C = [
    "# #    #    #    # # # # #   #   #  #  #",
    "# .    .    .    . . w . .   KEY IS WIN #",
    "# WALL IS   STOP . . w . .   .   .  .  #",
    "# .    .    .    . . w . .   .   .  .  #",
    "# .    baba .    . . w . .   .   .  .  #",
    "# .    .    .    . . w . key .   .  .  #",
    "# .    .    .    . . w . .   .   .  .  #",
    "# BABA IS   YOU  . . w . .   .   .  .  #",
    "# #    #    #    # # # # #   #   #  #  #",
]
EXAMPLE_D = [
    "# #    #    #    #    # #   #    #",
    "# BABA IS   YOU  .    . .   BALL #",
    "# .    .    .    .    . .   IS   #",
    "# .    .    .    .    . .   PUSH #",
    "# .    baba ball ball . .   .    #",
    "# .    .    .    .    . key .    #",
    "# .    .    .    .    . .   .    #",
    "# KEY  IS   LOSE .    . .   .    #",
    "# #    #    #    #    # #   #    #",
]
EXAMPLE_F = [
    "# #    #    #    # # # # #   #    #  #   #",
    "# WALL IS   STOP . . w . .   DOOR IS WIN #",
    "# .    .    .    . . w door . .  .  .   #",
    "# .    .    .    . . w . .   .    .  .   #",
    "# .    .    .    . . w key . .  .  .   #",
    "# .    baba KEY  . . w . .   .    .  .   #",
    "# BABA IS   YOU  . . w . .   .    .  .   #",
    "# .    .    .    . . w . .   .    .  .   #",
    "# #    #    #    # # # # #   #    #  #   #",
]
EXAMPLE_G = [
    "# # # # # # # # #",
    "# . . . . WIN IS BALL #",
    "# . . BALL . . . . #",
    "# . KEY IS PUSH . . . #",
    "# . . WIN . . ball . #",
    "# baba . . . . . . #",
    "# . . . BALL IS KEY . #",
    "# BABA IS YOU . . . . #",
    "# # # # # # # # #",
]


def _game(rows: list[str]) -> BabaGame:
    return BabaGame(grid_from_rows(rows))


def _text(game: BabaGame) -> str:
    return observation_text(game.grid, game.rules)


def _objects(game: BabaGame) -> list[str]:
    return _text(game).split("Objects on the map:\n", 1)[1].split("\n")


def _baba(game: BabaGame) -> tuple[int, int]:
    return game.grid.find("baba", "thing")[0]


def test_example_a_goto_win_text_and_reward() -> None:
    game = _game(EXAMPLE_A)
    assert _text(game) == (
        "Active rules:\ndoor is win\nbaba is you\n\nObjects on the map:\n"
        "rule `door` 2 step to the left and 2 step up\n"
        "rule `is` 1 step to the left and 2 step up\n"
        "rule `win` 2 step up\n"
        "door 2 step to the left\n"
        "rule `baba` 2 step to the left and 3 steps down\n"
        "rule `is` 1 step to the left and 3 steps down\n"
        "rule `you` 3 steps down"
    )
    first = game.step(LEFT)
    assert (first.reward, first.done, _baba(game)) == (0.0, False, (2, 3))
    lines = _objects(game)
    assert "rule `is` 2 step up" in lines and "door 1 step to the left" in lines
    assert "rule `you` 1 step to the right and 3 steps down" in lines
    second = game.step(LEFT)
    assert second.done and second.won and second.reward == 1 - 0.9 * (2 / 100) == 0.982
    assert _objects(game) == [
        "rule `door` 2 step up",
        "rule `is` 1 step to the right and 2 step up",
        "rule `win` 2 steps to the right and 2 step up",
        "rule `baba` 3 steps down",
        "rule `is` 1 step to the right and 3 steps down",
        "rule `you` 2 steps to the right and 3 steps down",
    ]


def test_example_b_make_win_by_pushing_ball_up() -> None:
    game = _game(EXAMPLE_B)
    assert _text(game).startswith("Active rules:\nbaba is you\n\nObjects on the map:\n"
                                  "rule `is` 1 step to the right and 1 step up\n")
    actions = [UP, RIGHT, DOWN, RIGHT, DOWN, DOWN, LEFT, UP, UP, RIGHT, RIGHT, RIGHT, DOWN]
    outcomes = []
    for number, action in enumerate(actions, start=1):
        outcomes.append(game.step(action))
        if number == 1:
            assert _baba(game) == (1, 1)
        if number == 2:
            assert _baba(game) == (2, 1)
            assert [game.grid.top(x, 1).key for x in (3, 4)] == ["IS", "WIN"]
        if number == 8:
            assert game.grid.top(2, 2).key == "BALL"
        if number == 9:
            assert _text(game).startswith("Active rules:\nball is win\nbaba is you\n\n")
        if number == 12:
            assert _baba(game) == (5, 2)
    assert [o.done for o in outcomes] == [False] * 12 + [True]
    assert outcomes[-1].won and outcomes[-1].reward == 1 - 0.9 * (13 / 100)
    assert outcomes[-1].reward == pytest.approx(0.883)


def test_example_c_stop_blocks_until_broken() -> None:
    game = _game(EXAMPLE_C)
    assert game.rules.pairs() == [("key", "win"), ("wall", "stop"), ("baba", "you")]
    lines = _objects(game)
    assert lines[:2] == ["wall 4 steps to the right and 3 step up",
                         "rule `key` 7 steps to the right and 3 step up"]
    assert "key 6 steps to the right and 1 step down" in lines
    blocked = _game(EXAMPLE_C)
    for _ in range(3):
        blocked.step(RIGHT)
    assert _baba(blocked) == (5, 4)
    assert blocked.step(RIGHT).reward == 0.0 and _baba(blocked) == (5, 4)

    game.step(UP)
    game.step(UP)
    assert game.grid.top(2, 1).key == "IS"
    assert game.rules.pairs() == [("key", "win"), ("baba", "you")]
    for number in range(3, 9):
        game.step(RIGHT)
        if number == 6:
            assert _baba(game) == (6, 2)
            lines = _objects(game)
            assert "wall 1 step up" in lines and "wall 1 step down" in lines
            assert [s for s in game.grid.stack(6, 2)] and game.grid.stack(6, 2)[0].name == "wall"
    outcomes = [game.step(DOWN) for _ in range(3)]
    assert [o.done for o in outcomes] == [False, False, True]
    assert outcomes[-1].won and outcomes[-1].reward == pytest.approx(0.901)
    assert game.steps == 11


def test_example_d_vertical_rule_push_chain_blocked_push_and_lose() -> None:
    game = _game(EXAMPLE_D)
    assert _text(game) == (
        "Active rules:\nbaba is you\nball is push\nkey is lose\n\nObjects on the map:\n"
        "rule `baba` 1 step to the left and 3 step up\n"
        "rule `is` 3 step up\n"
        "rule `you` 1 step to the right and 3 step up\n"
        "rule `ball` 5 steps to the right and 3 step up\n"
        "rule `is` 5 steps to the right and 2 step up\n"
        "rule `push` 5 steps to the right and 1 step up\n"
        "ball 1 step to the right\n"
        "ball 2 steps to the right\n"
        "key 4 steps to the right and 1 step down\n"
        "rule `key` 1 step to the left and 3 steps down\n"
        "rule `is` 3 steps down\n"
        "rule `lose` 1 step to the right and 3 steps down"
    )
    for _ in range(3):
        assert game.step(RIGHT).reward == 0.0
    assert _baba(game) == (5, 4)
    assert [game.grid.top(x, 4).key for x in (6, 7)] == ["ball", "ball"]
    assert not game.step(RIGHT).done
    # §3.1 applied down the chain: the middle ball stacks onto the stuck front ball, baba follows
    assert _baba(game) == (6, 4)
    assert [o.key for o in game.grid.stack(7, 4)] == ["ball", "ball"]
    lines = _objects(game)
    assert "ball 1 step to the right" in lines and "key 1 step down" in lines
    assert sum(line.startswith("ball") for line in lines) == 1
    lost = game.step(DOWN)
    assert lost.lost and lost.done and lost.reward == -1.0


def _example_f_env(seed: int = 0) -> BabaIsAITextEnv:
    env = BabaIsAITextEnv("env/two_room-make_you")
    env.reset(seed=seed)
    level = Level("env/two_room-make_you", grid_from_rows(EXAMPLE_F),
                  "make[key is you], goto[door]", "door", "key", "ball")
    env.reset_to(level)
    return env


def test_example_e_breaking_you_resets_with_notice() -> None:
    env = _example_f_env(seed=3)
    obs, reward, terminated, truncated, info = env.step("down")
    assert obs.text.startswith(YOU_LOST_NOTICE + "\nActive rules:\n")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["you_lost_reset"] and info["step_count"] == 0
    assert ("baba", "you") in env.game.rules.pairs()
    # the new level is the next one of the env's seeded stream
    other = BabaIsAITextEnv("env/two_room-make_you")
    other.reset(seed=3)
    assert obs.text == YOU_LOST_NOTICE + "\n" + other.reset()[0].text


def test_example_f_become_the_key() -> None:
    env = _example_f_env()
    names = ["up", "right", "right", "down", "left", "left", "up", "left"]
    for name in names:
        assert env.step(name)[1:3] == (0.0, False)
    assert env.game.grid.top(1, 5).key == "KEY"
    obs, reward, done, _, info = env.step("down")
    assert info["rules"] == ["wall is stop", "door is win", "key is you"]
    assert [env.game.grid.top(1, y).key for y in (6, 7)] == ["KEY", "BABA"]
    assert "\nwall 1 step to the left\n\nwall 1 step to the left and 1 step down\n" in obs.text
    assert env.step("up")[1:3] == (0.0, False)
    obs, reward, done, _, info = env.step("up")
    assert done and info["success"] and reward == pytest.approx(0.901)


def test_example_g_parsing_and_replacement() -> None:
    game = _game(EXAMPLE_G)
    assert game.rules.pairs() == [("key", "push"), ("ball", "win"), ("baba", "you")]
    assert game.rules.replacement_pairs() == [("ball", "key")]
    assert _text(game).startswith("Active rules:\nkey is push\nball is win\nbaba is you\n\n")
    game.step(UP)
    assert _baba(game) == (1, 4)
    assert [o.key for o in game.grid.stack(6, 4)] == ["ball", "key"]
    assert "key 5 steps to the right" in _objects(game)
    assert not any(line.startswith("ball") for line in _objects(game))
    game.step(DOWN)
    assert [o.key for o in game.grid.stack(6, 4)] == ["ball", "key"]
