"""The rules engine: parsing, pushing text, push chains, STOP, PULL, MOVE, OPEN/SHUT, win, lose."""

from __future__ import annotations

import pytest

from babaisai_ascii import grid_from_rows, grid_to_rows
from babaisai_solver import you_positions
from longturn.envs.babaisai.game import BabaGame
from longturn.envs.babaisai.rules import parse_rules

IDLE, UP, RIGHT, DOWN, LEFT = 0, 1, 2, 3, 4


def _game(*rows: str, max_steps: int = 100) -> BabaGame:
    return BabaGame(grid_from_rows(list(rows)), max_steps=max_steps)


def _baba(game: BabaGame) -> tuple[int, int]:
    return game.grid.find("baba", "thing")[0]


def _stack(game: BabaGame, x: int, y: int) -> list[str]:
    return [o.key for o in game.grid.stack(x, y)]


def test_horizontal_vertical_and_shared_is_in_scan_order() -> None:
    rules = parse_rules(grid_from_rows([
        "# #    #   #   #",
        "# .    KEY .   #",
        "# BALL IS  WIN #",
        "# .    STOP .  #",
        "# #    #   #   #",
    ]))
    assert rules.pairs() == [("ball", "win"), ("key", "stop")]
    assert rules.properties[1].cells == ((2, 1), (2, 2), (2, 3))


def test_only_left_to_right_and_top_to_bottom_read() -> None:
    rules = parse_rules(grid_from_rows([
        "# #   #  #    #",
        "# WIN IS BALL #",
        "# .   .  YOU  #",
        "# .   .  IS   #",
        "# .   .  BABA #",
        "# #   #  #    #",
    ]))
    assert rules.pairs() == [] and rules.replacement_pairs() == []


def test_duplicates_are_kept_and_noun_is_noun_is_hidden() -> None:
    rules = parse_rules(grid_from_rows([
        "# #    #  #    #",
        "# BABA IS YOU  #",
        "# BABA IS YOU  #",
        "# KEY  IS BALL #",
        "# #    #  #    #",
    ]))
    assert rules.pairs() == [("baba", "you"), ("baba", "you")]
    assert rules.replacement_pairs() == [("key", "ball")]


def test_only_top_objects_spell_rules() -> None:
    grid = grid_from_rows([
        "# #         #  #   #",
        "# BABA+baba IS YOU #",
        "# #         #  #   #",
    ])
    assert parse_rules(grid).pairs() == []


def test_pushing_text_apart_breaks_the_rule_after_the_move() -> None:
    game = _game(
        "# #    #    #   # #",
        "# .    .    .   . #",
        "# KEY  IS   WIN . #",
        "# .    baba .   . #",
        "# BABA IS   YOU . #",
        "# #    #    #   # #",
    )
    assert game.rules.pairs() == [("key", "win"), ("baba", "you")]
    assert game.step(UP).reward == 0.0
    assert game.grid.top(2, 1).key == "IS" and _baba(game) == (2, 2)
    assert game.rules.pairs() == [("baba", "you")]


def test_rule_made_by_this_move_counts_only_from_the_next_move() -> None:
    game = _game(
        "# #    #    #   # #",
        "# key  IS   WIN . #",
        "# .    .    .   . #",
        "# KEY  .    .   . #",
        "# baba .    .   . #",
        "# BABA IS   YOU . #",
        "# #    #    #   # #",
    )
    first = game.step(UP)  # KEY (1,3) -> (1,2)
    assert not first.done and game.rules.pairs() == [("baba", "you")]
    second = game.step(UP)  # KEY onto the key thing at (1,1): KEY IS WIN from now on
    assert not second.done and game.rules.pairs() == [("key", "win"), ("baba", "you")]
    assert _stack(game, 1, 1) == ["key", "KEY"]


def test_push_chain_moves_every_block_and_stops_at_the_border() -> None:
    game = _game(
        "# #    #    #  #   #    # # #",
        "# baba IS   WIN STOP . . . #",
        "# BABA IS   YOU .   .  . . #",
        "# #    #    #  #   #    # # #",
    )
    game.step(RIGHT)
    assert grid_to_rows(game.grid)[1] == "# . baba IS WIN STOP . . #"
    for _ in range(3):
        game.step(RIGHT)
    assert grid_to_rows(game.grid)[1] == "# . . . baba IS WIN STOP #"
    game.step(RIGHT)  # STOP against the border: the chain and baba stay
    assert grid_to_rows(game.grid)[1] == "# . . . baba IS WIN STOP #"


def test_stop_thing_blocks_movers_and_pushed_chains() -> None:
    game = _game(
        "# #    #    #    # # #",
        "# baba IS   w    . . #",
        "# .    ball w    . . #",
        "# WALL IS   STOP . . #",
        "# BABA IS   YOU  . . #",
        "# #    #    #    # # #",
    )
    assert game.step(RIGHT).reward == 0.0
    assert _baba(game) == (1, 1) and game.grid.top(2, 1).key == "IS"  # IS cannot enter the wall
    game.step(DOWN)
    game.step(RIGHT)  # the ball is not PUSH and not STOP: baba stacks on it
    assert _stack(game, 2, 2) == ["ball", "baba"]
    game.step(RIGHT)
    assert _baba(game) == (2, 2)


def test_push_thing_is_pushed_and_others_are_entered() -> None:
    game = _game(
        "# #    #    #  #   # #",
        "# baba ball .  key . #",
        "# BALL IS   PUSH . . #",
        "# BABA IS   YOU  . . #",
        "# #    #    #  #   # #",
    )
    game.step(RIGHT)
    assert _stack(game, 3, 1) == ["ball"] and _baba(game) == (2, 1)
    game.step(RIGHT)  # the ball stacks onto the key, baba follows
    assert _stack(game, 4, 1) == ["key", "ball"] and _baba(game) == (3, 1)


def test_pull_drags_along_even_when_the_mover_is_blocked() -> None:
    game = _game(
        "# #    #    #    # #",
        "# ball baba .    . #",
        "# BALL IS   PULL . #",
        "# BABA IS   YOU  . #",
        "# #    #    #    # #",
    )
    game.step(RIGHT)
    assert grid_to_rows(game.grid)[1] == "# . ball baba . #"
    game.step(RIGHT)
    game.step(RIGHT)  # baba is blocked by the border; the ball is still pulled onto baba's cell
    assert _stack(game, 4, 1) == ["baba", "ball"]


def test_move_things_walk_their_facing_and_idle_freezes_them() -> None:
    game = _game(
        "# #    #  #    #    #",
        "# ball .  .    .    #",
        "# BALL IS MOVE .    #",
        "# BABA IS YOU  baba #",
        "# #    #  #    #    #",
    )
    game.step(IDLE)
    assert game.grid.top(1, 1).key == "ball"
    game.step(UP)
    assert game.grid.top(2, 1).key == "ball"
    for _ in range(4):
        game.step(UP)
    assert game.grid.top(4, 1).key == "ball"  # against the border it stays (no bounce)


def test_open_meets_shut_destroys_both() -> None:
    game = _game(
        "# #   #    #    #",
        "# key door .    #",
        "# KEY IS   YOU  #",
        "# KEY IS   OPEN #",
        "# DOOR IS  SHUT #",
        "# #   #    #    #",
    )
    game.step(RIGHT)
    assert game.grid.is_empty(1, 1) and game.grid.is_empty(2, 1)
    assert you_positions(game) == []


def test_win_needs_entering_and_idle_never_wins() -> None:
    game = _game(
        "# #    #    #   #",
        "# baba ball .   #",
        "# BALL IS   WIN #",
        "# BABA IS   YOU #",
        "# #    #    #   #",
    )
    assert game.step(IDLE).reward == 0.0
    outcome = game.step(RIGHT)
    assert outcome.won and outcome.done and outcome.reward == 1 - 0.9 * (2 / 100)


def test_stop_win_thing_cannot_be_entered() -> None:
    game = _game(
        "# #    #    #    #",
        "# baba ball .    #",
        "# BALL IS   WIN  #",
        "# BALL IS   STOP #",
        "# BABA IS   YOU  #",
        "# #    #    #    #",
    )
    outcome = game.step(RIGHT)
    assert not outcome.won and _baba(game) == (1, 1)


def test_you_and_win_wins_only_when_blocked() -> None:
    game = _game(
        "# #    #    #   #",
        "# .    baba .   #",
        "# BABA IS   WIN #",
        "# BABA IS   YOU #",
        "# #    #    #   #",
    )
    assert not game.step(LEFT).won
    assert game.step(LEFT).won  # blocked by the border: it "arrives" on its own cell


def test_lose_ends_with_minus_one() -> None:
    game = _game(
        "# #    #   #    #",
        "# baba key .    #",
        "# KEY  IS  LOSE #",
        "# BABA IS  YOU  #",
        "# #    #   #    #",
    )
    outcome = game.step(RIGHT)
    assert (outcome.lost, outcome.done, outcome.reward) == (True, True, -1.0)


def test_last_you_mover_decides_win() -> None:
    game = _game(
        "# #    #    #    # #",
        "# baba ball .    . #",
        "# .    .    baba . #",
        "# BALL IS   WIN  . #",
        "# BABA IS   YOU  . #",
        "# #    #    #    # #",
    )
    outcome = game.step(RIGHT)  # the first baba enters the ball, the later one does not
    assert not outcome.won and not outcome.done


def test_step_limit_ends_the_episode_without_reward() -> None:
    game = _game(
        "# #    #  #   #",
        "# baba .  .   #",
        "# BABA IS YOU #",
        "# #    #  #   #",
        max_steps=3,
    )
    outcomes = [game.step(IDLE) for _ in range(3)]
    assert [o.done for o in outcomes] == [False, False, True]
    assert all(o.reward == 0.0 for o in outcomes)


@pytest.mark.parametrize("steps,expected", [(2, 0.982), (11, 0.901), (13, 0.883)])
def test_win_reward_formula(steps: int, expected: float) -> None:
    game = _game(
        "# #    #  #   #",
        "# baba .  ball #",
        "# BALL IS WIN #",
        "# BABA IS YOU #",
        "# #    #  #   #",
    )
    for _ in range(steps - 2):
        game.step(IDLE)
    game.step(RIGHT)
    outcome = game.step(RIGHT)
    assert outcome.reward == 1 - 0.9 * (steps / 100) == pytest.approx(expected)


def test_replacement_stacks_a_new_thing_on_top() -> None:
    game = _game(
        "# #    #  #    #   #",
        "# baba .  .    key #",
        "# KEY  IS BALL .   #",
        "# BABA IS YOU  .   #",
        "# #    #  #    #   #",
    )
    game.step(IDLE)
    assert _stack(game, 4, 1) == ["key"]  # idle does not re-read rules or replace
    game.step(RIGHT)
    assert _stack(game, 4, 1) == ["key", "ball"]
