"""Worked examples of SPEC_babyai_text.md §9: the exact text BALROG/Verlog models were shown."""

from __future__ import annotations

import pytest
from minigrid.core.grid import Grid
from minigrid.core.world_object import Ball, Box, Door, Key

from longturn.envs.babyai import BabyAITextEnv
from longturn.envs.babyai.describe import describe, observation_text
from longturn.envs.babyai.level import MixedTrainLocalLevel


def _room(width: int = 8, height: int = 8, kind: str = "goto") -> MixedTrainLocalLevel:
    """A level whose grid is replaced by empty walled room(s), ready to be furnished by hand."""
    env = MixedTrainLocalLevel(kind)
    env.reset(seed=0)
    env.grid = Grid(width, height)
    env.grid.wall_rect(0, 0, width, height)
    env.carrying = None
    return env


def _text(env: MixedTrainLocalLevel) -> str:
    return observation_text(describe(env))


def test_example1_single_room_facing_north() -> None:
    env = _room()
    env.grid.set(3, 0, Door("purple", is_open=False))
    env.grid.set(4, 2, Ball("red"))
    env.grid.set(6, 3, Key("blue"))
    env.agent_pos, env.agent_dir = (5, 4), 3
    assert describe(env) == [
        "You see a wall 4 steps forward",
        "You see a wall 2 steps right",
        "You see a closed purple door 2 steps left and 4 steps forward",
        "You see a red ball 1 step left and 2 steps forward",
        "You see a blue key 1 step right and 1 step forward",
    ]
    assert _text(env) == (
        "a wall 4 steps forward\n"
        "a wall 2 steps right\n"
        "a closed purple door 2 steps left and 4 steps forward\n"
        "a red ball 1 step left and 2 steps forward\n"
        "a blue key 1 step right and 1 step forward"
    )
    env.step(env.actions.right)
    assert _text(env) == (
        "a wall 2 steps forward\na wall 3 steps right\na blue key 1 step left and 1 step forward"
    )


def test_example2_carrying_and_blocked_scans() -> None:
    env = _room()
    env.grid.set(4, 3, Ball("purple"))
    env.grid.set(2, 1, Box("grey"))
    env.grid.set(4, 5, Key("green"))
    env.agent_pos, env.agent_dir = (2, 3), 0
    env.carrying = Key("yellow")
    assert _text(env) == (
        "You carry a yellow key\n"
        "a grey box 2 steps left\n"
        "a purple ball 2 steps forward\n"
        "a green key 2 steps right and 2 steps forward"
    )


def _example3(see_through_walls: bool) -> MixedTrainLocalLevel:
    env = _room(15, 8, kind="open")
    env.grid.vert_wall(7, 0, 8)
    env.grid.set(7, 4, Door("yellow", is_locked=True))
    env.grid.set(9, 2, Door("blue", is_open=True))
    env.grid.set(5, 6, Ball("grey"))
    env.agent_pos, env.agent_dir = (10, 4), 2
    env.see_through_walls = see_through_walls
    return env


def test_example3_locked_door_open_door_hidden_ball() -> None:
    assert _text(_example3(see_through_walls=False)) == (
        "a wall 3 steps left\n"
        "a locked yellow door 3 steps forward\n"
        "a open blue door 2 steps right and 1 step forward"
    )


def test_example3_hidden_ball_visible_through_walls() -> None:
    lines = describe(_example3(see_through_walls=True))
    assert "You see a grey ball 2 steps left and 5 steps forward" in lines


def test_nothing_to_describe_gives_empty_text() -> None:
    env = _room(15, 15)
    env.agent_pos, env.agent_dir = (7, 12), 3
    assert describe(env) == []
    assert _text(env) == ""


def test_wall_beside_agent_and_object_beside_agent() -> None:
    env = _room()
    env.grid.set(2, 3, Key("red"))
    env.agent_pos, env.agent_dir = (1, 3), 3  # facing north: left is west, right is east
    assert describe(env) == [
        "You see a wall 3 steps forward",
        "You see a wall 1 step left",
        "You see a red key 1 step right",
    ]


def test_example4_goto_episode_seed_536() -> None:
    env = BabyAITextEnv("goto")
    obs, info = env.reset(seed=536)
    level = env.unwrapped
    assert info["mission"] == "go to the blue ball"
    assert info["max_steps"] == 64
    assert tuple(int(v) for v in level.agent_pos) == (6, 1) and level.agent_dir == 1
    objects = [(x, y, c.type, c.color) for x in range(8) for y in range(8)
               if (c := level.grid.get(x, y)) is not None and c.type != "wall"]
    assert objects == [(6, 3, "ball", "blue")]
    assert obs.text == "a wall 1 step left\na blue ball 2 steps forward"
    obs, reward, terminated, truncated, info = env.step("go forward")
    assert obs.text == "a wall 1 step left\na blue ball 1 step forward"
    assert reward == pytest.approx(0.9859375)
    assert terminated and not truncated and info["success"]


@pytest.mark.parametrize("task", ["goto", "pickup", "open", "pick_up_seq_go_to", "putnext"])
def test_the_view_minigrid_returned_is_the_view_described(task) -> None:
    """The env describes the `image` its step and reset return instead of computing the view a
    second time; whatever was done (a pickup, a drop, a door opened), the lines are those of the
    view computed afresh."""
    import random

    env = BabyAITextEnv(task)
    for seed in range(4):
        _, info = env.reset(seed=seed)
        assert info["descriptions"] == describe(env.unwrapped)
        rng = random.Random(seed)
        for _ in range(30):
            _, _, terminated, truncated, info = env.step(rng.choice(env.actions))
            assert info["descriptions"] == describe(env.unwrapped)
            if terminated or truncated:
                break
