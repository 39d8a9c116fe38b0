"""Crafter's local view in English, exactly as the BALROG/Verlog wrappers print it (SPEC §3).

Two variants: "V" (Verlog: `1 steps`, lines by ascending id, swapped front-cell bounds test) and
"B" (BALROG main with default options: correct plurals, lines in scan order, correct bounds test).
The wording must match the originals so prompts and trajectories are comparable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from longturn.envs.crafter.vocabulary import ID_NAMES, PLAYER_ID, VITALS

VARIANTS = ("V", "B")
HALF_WIDTH, HALF_HEIGHT = 4, 3  # the 9x7 window of crafter's image, centred on the player
CENTRE = (HALF_WIDTH, HALF_HEIGHT)

SLEEPING = "You are sleeping, and will not be able take actions until energy is full."  # sic
DIED = "You died."
SEE_NOTHING = "You see nothing away from you."
FACE_NOTHING = "You face nothing at your front."


@dataclass(frozen=True)
class Frame:
    """What the text needs from one game state (crafter's `info` plus a few player fields)."""

    semantic: np.ndarray  # world map of ids, indexed [x][y] (x east, y south)
    player_pos: tuple[int, int]
    facing: tuple[int, int]
    inventory: Mapping[str, int]
    sleeping: bool = False
    dead: bool = False


def local_window(semantic: np.ndarray, player_pos: tuple[int, int]) -> np.ndarray:
    """The 9x7 ids around the player, with the originals' edge behaviour (plain slicing): empty
    when it would start west or north of the world, truncated at the east and south borders."""
    px, py = int(player_pos[0]), int(player_pos[1])
    if px - HALF_WIDTH < 0 or py - HALF_HEIGHT < 0:
        return semantic[0:0, 0:0]
    return semantic[px - HALF_WIDTH: px + HALF_WIDTH + 1, py - HALF_HEIGHT: py + HALF_HEIGHT + 1]


def nearest_cells(window: np.ndarray) -> dict[int, tuple[int, int, int]]:
    """For each id in the window (player excluded): (distance, dx, dy) of its nearest cell.

    Cells are scanned column by column (west to east), top to bottom inside a column; a later
    cell replaces an earlier one only when strictly nearer, so ties go west, then north. The dict
    keeps first-met order (variant B's line order)."""
    nearest: dict[int, tuple[int, int, int]] = {}
    for i in range(window.shape[0]):
        for j in range(window.shape[1]):
            kind = int(window[i, j])
            if kind == PLAYER_ID:
                continue
            dx, dy = i - CENTRE[0], j - CENTRE[1]
            distance = abs(dx) + abs(dy)
            if kind not in nearest or distance < nearest[kind][0]:
                nearest[kind] = (distance, dx, dy)
    return nearest


def direction_word(dx: int, dy: int) -> str:
    """`north`, `south-west`, ...: the vertical part first, joined by `-`."""
    parts = []
    if dy:
        parts.append("north" if dy < 0 else "south")
    if dx:
        parts.append("west" if dx < 0 else "east")
    return "-".join(parts)


def see_block(window: np.ndarray, variant: str = "V") -> str:
    """`You see:` and one line per visible kind, or the 'nothing' sentence."""
    nearest = nearest_cells(window)
    kinds = sorted(nearest) if variant == "V" else list(nearest)
    lines = []
    for kind in kinds:
        distance, dx, dy = nearest[kind]
        steps = "steps" if variant == "V" or distance != 1 else "step"
        lines.append(f"- {ID_NAMES[kind]} {distance} {steps} to your {direction_word(dx, dy)}")
    return "You see:\n" + "\n".join(lines) if lines else SEE_NOTHING


def face_line(window: np.ndarray, facing: tuple[int, int], variant: str = "V") -> str:
    """`You face {name} at your front.`, or 'nothing' when the wrapper reports nothing.

    V compares the x index with the window's y-size and vice versa (a quirk that only matters at
    the south-east border); where that lets an index past the window through (V crashes there) we
    report 'nothing'. B uses the correct test."""
    x, y = CENTRE[0] + int(facing[0]), CENTRE[1] + int(facing[1])
    size_x, size_y = window.shape
    limit_x, limit_y = (size_y, size_x) if variant == "V" else (size_x, size_y)
    if not (0 <= x < min(limit_x, size_x) and 0 <= y < min(limit_y, size_y)):
        return FACE_NOTHING
    return f"You face {ID_NAMES[int(window[x, y])]} at your front."


def long_term_context(frame: Frame, variant: str = "V") -> str:
    """Status prefix, `You see` block and `You face` line (three empty lines after a prefix)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown crafter text variant {variant!r}; valid: {VARIANTS}")
    window = local_window(frame.semantic, frame.player_pos)
    prefix = SLEEPING if frame.sleeping else DIED if frame.dead else ""
    text = (prefix + "\n\n" if prefix else "") + "\n\n" + see_block(window, variant)
    return (text + "\n\n" + face_line(window, frame.facing, variant) + "\n\n").strip()


def short_term_context(inventory: Mapping[str, int]) -> str:
    """Vitals out of 9, then the non-zero items in crafter's inventory order."""
    status = "Your status:\n" + "\n".join(f"- {name}: {inventory[name]}/9" for name in VITALS)
    items = [f"- {name}: {count}" for name, count in inventory.items()
             if name not in VITALS and count != 0]
    held = ("Your inventory:\n" + "\n".join(items) if items
            else "You have nothing in your inventory.")
    return status + "\n\n" + held


def compose_observation(short_term: str, long_term: str) -> str:
    """Status and inventory, then the view: the observation as the reference prompt shows it."""
    return short_term + "\n" + long_term


def observation_text(frame: Frame, variant: str = "V") -> str:
    """The current observation of one frame (`compose_observation` of its two parts)."""
    return compose_observation(short_term_context(frame.inventory),
                               long_term_context(frame, variant))
