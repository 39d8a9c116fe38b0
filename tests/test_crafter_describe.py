"""Crafter text: SPEC_crafter_text.md §9 examples 1-4 reproduced exactly, in both variants."""

from __future__ import annotations

import numpy as np
import pytest

from longturn.envs.crafter.describe import (
    Frame, direction_word, face_line, local_window, long_term_context, observation_text,
    short_term_context,
)
from longturn.envs.crafter.vocabulary import ID_NAMES

VITALS_FULL = {"health": 9, "food": 9, "drink": 9, "energy": 9}
ITEMS_NONE = {k: 0 for k in ("sapling", "wood", "stone", "coal", "iron", "diamond", "wood_pickaxe",
                             "stone_pickaxe", "iron_pickaxe", "wood_sword", "stone_sword",
                             "iron_sword")}


def world(items: dict[tuple[int, int], str], player: tuple[int, int] = (32, 32)) -> np.ndarray:
    """64x64 grass with the player and the listed items at absolute cells."""
    semantic = np.full((64, 64), ID_NAMES.index("grass"), dtype=np.uint8)
    semantic[player] = ID_NAMES.index("player")
    for cell, name in items.items():
        semantic[cell] = ID_NAMES.index(name)
    return semantic


def inventory(**counts: int) -> dict[str, int]:
    return {**VITALS_FULL, **ITEMS_NONE, **counts}


EXAMPLE_1 = Frame(
    semantic=world({(30, 31): "tree", (34, 33): "tree", (32, 35): "water", (36, 29): "stone",
                    (31, 32): "cow", (33, 32): "table", (28, 35): "sand", (32, 33): "zombie",
                    (37, 32): "diamond", (32, 36): "iron"}),
    player_pos=(32, 32), facing=(0, 1),
    inventory=inventory(health=7, food=5, drink=3, energy=8, sapling=1, wood=3, wood_pickaxe=1),
)
EXAMPLE_1_V = """You see:
- water 3 steps to your south
- grass 1 steps to your north
- stone 7 steps to your north-east
- sand 7 steps to your south-west
- tree 3 steps to your north-west
- table 1 steps to your east
- cow 1 steps to your west
- zombie 1 steps to your south

You face zombie at your front."""
EXAMPLE_1_B = """You see:
- grass 1 step to your north
- sand 7 steps to your south-west
- tree 3 steps to your north-west
- cow 1 step to your west
- zombie 1 step to your south
- water 3 steps to your south
- table 1 step to your east
- stone 7 steps to your north-east

You face zombie at your front."""
EXAMPLE_1_SHORT = """Your status:
- health: 7/9
- food: 5/9
- drink: 3/9
- energy: 8/9

Your inventory:
- sapling: 1
- wood: 3
- wood_pickaxe: 1"""

EXAMPLE_2 = Frame(
    semantic=world({(33, 31): "tree", (31, 33): "water"}), player_pos=(32, 32), facing=(-1, 0),
    inventory=inventory(energy=2), sleeping=True,
)
SLEEP_PREFIX = "You are sleeping, and will not be able take actions until energy is full.\n\n\n\n"
EXAMPLE_2_V = SLEEP_PREFIX + """You see:
- water 2 steps to your south-west
- grass 1 steps to your west
- tree 2 steps to your north-east

You face grass at your front."""
EXAMPLE_2_B = SLEEP_PREFIX + """You see:
- grass 1 step to your west
- water 2 steps to your south-west
- tree 2 steps to your north-east

You face grass at your front."""
EXAMPLE_2_SHORT = """Your status:
- health: 9/9
- food: 9/9
- drink: 9/9
- energy: 2/9

You have nothing in your inventory."""


def test_example_1_mixed_scene() -> None:
    assert long_term_context(EXAMPLE_1, "V") == EXAMPLE_1_V
    assert long_term_context(EXAMPLE_1, "B") == EXAMPLE_1_B
    assert short_term_context(EXAMPLE_1.inventory) == EXAMPLE_1_SHORT


def test_example_2_sleeping_facing_west() -> None:
    assert long_term_context(EXAMPLE_2, "V") == EXAMPLE_2_V
    assert long_term_context(EXAMPLE_2, "B") == EXAMPLE_2_B
    assert short_term_context(EXAMPLE_2.inventory) == EXAMPLE_2_SHORT


def test_example_3_dead() -> None:
    frame = Frame(semantic=world({}), player_pos=(32, 32), facing=(0, 1),
                  inventory=inventory(health=0), dead=True)
    assert long_term_context(frame, "V") == (
        "You died.\n\n\n\nYou see:\n- grass 1 steps to your west\n\nYou face grass at your front.")
    assert long_term_context(frame, "B") == (
        "You died.\n\n\n\nYou see:\n- grass 1 step to your west\n\nYou face grass at your front.")


@pytest.mark.parametrize("variant", ["V", "B"])
def test_example_4_world_edge(variant: str) -> None:
    frame = Frame(semantic=world({}, player=(2, 32)), player_pos=(2, 32), facing=(0, 1),
                  inventory=inventory())
    assert long_term_context(frame, variant) == (
        "You see nothing away from you.\n\nYou face nothing at your front.")


@pytest.mark.parametrize("player", [(32, 1), (0, 0), (3, 3)])
def test_window_is_empty_when_it_starts_outside_the_world(player: tuple[int, int]) -> None:
    assert local_window(world({}, player=player), player).size == 0


def test_window_is_truncated_at_the_south_east_border() -> None:
    assert local_window(world({}, player=(62, 62)), (62, 62)).shape == (6, 5)


def test_front_cell_quirk_at_the_south_border_is_variant_v_only() -> None:
    # py = 62: the window is 9 wide and 5 tall; V compares x (5) with the height (5) -> "nothing"
    semantic = world({(63, 62): "tree"}, player=(62, 62))
    window = local_window(semantic, (62, 62))
    assert face_line(window, (1, 0), "V") == "You face nothing at your front."
    assert face_line(window, (1, 0), "B") == "You face tree at your front."


def test_front_cell_past_the_east_border_reads_nothing() -> None:
    # px = 63 facing east: V's original crashes here; we report "nothing" in both variants
    window = local_window(world({}, player=(63, 32)), (63, 32))
    assert face_line(window, (1, 0), "V") == face_line(window, (1, 0), "B") == (
        "You face nothing at your front.")


def test_direction_words() -> None:
    assert [direction_word(dx, dy) for dx, dy in
            [(0, -1), (0, 2), (-1, 0), (3, 0), (-1, -1), (2, -1), (-1, 1), (1, 1)]] == [
        "north", "south", "west", "east", "north-west", "north-east", "south-west", "south-east"]


def test_observation_text_is_status_then_view() -> None:
    assert observation_text(EXAMPLE_1, "V") == EXAMPLE_1_SHORT + "\n" + EXAMPLE_1_V


def test_unknown_variant_raises() -> None:
    with pytest.raises(ValueError, match="variant 'X'"):
        long_term_context(EXAMPLE_1, "X")


def test_id_table_matches_crafter() -> None:
    import crafter

    game = crafter.Env()
    names = {i: str(n) for n, i in game._world._mat_ids.items()}
    names.update({i: cls.__name__.lower() for cls, i in game._sem_view._obj_ids.items()})
    assert tuple(names[i] for i in range(len(ID_NAMES))) == ID_NAMES
