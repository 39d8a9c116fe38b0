"""English description of the agent's 7x7 view, exactly as BALROG/Verlog's BabyAI-Text prints it.

The wording (including the `a open door` quirk) must match the original so prompts and
trajectories are comparable (SPEC_babyai_text.md §3).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT, STATE_TO_IDX

_UNSEEN, _EMPTY, _WALL = 0, 1, 2
_DOOR = 4
_AGENT_VX, _AGENT_VY = 3, 6
_IDX_TO_STATE = {idx: name for name, idx in STATE_TO_IDX.items()}

# Wall scans: direction word and the view cells walked outward from the agent.
_SCANS: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = (
    ("forward", tuple((3, vy) for vy in range(5, -1, -1))),
    ("left", ((2, 6), (1, 6), (0, 6))),
    ("right", ((4, 6), (5, 6), (6, 6))),
)


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _wall_lines(img: np.ndarray) -> list[str]:
    lines = []
    for word, cells in _SCANS:
        for dist, (vx, vy) in enumerate(cells, start=1):
            kind = int(img[vx][vy][0])
            if kind in (_UNSEEN, _EMPTY):
                continue
            if kind == _WALL:
                lines.append(f"You see a wall {_steps(dist)} {word}")
            break
    return lines


def _thing(kind: int, color: int, state: int) -> str:
    if kind == _DOOR:
        # Quirk kept on purpose: always "a", so an open door reads "a open ... door".
        return f"You see a {_IDX_TO_STATE[state]} {IDX_TO_COLOR[color]} door "
    return f"You see a {IDX_TO_COLOR[color]} {IDX_TO_OBJECT[kind]} "


def _location(lat: int, fwd: int) -> str:
    side = "left" if lat < 0 else "right"
    if lat == 0:
        return f"{_steps(fwd)} forward"
    if fwd == 0:
        return f"{_steps(abs(lat))} {side}"
    return f"{_steps(abs(lat))} {side} and {_steps(fwd)} forward"


def _object_lines(img: np.ndarray) -> list[str]:
    lines = []
    for vx in range(img.shape[0]):
        for vy in range(img.shape[1]):
            kind, color, state = (int(v) for v in img[vx][vy])
            if kind in (_UNSEEN, _EMPTY, _WALL) or (vx, vy) == (_AGENT_VX, _AGENT_VY):
                continue
            lines.append(_thing(kind, color, state) + _location(vx - _AGENT_VX, _AGENT_VY - vy))
    return lines


def describe(env: Any, view: np.ndarray | None = None) -> list[str]:
    """Raw description lines of an unwrapped minigrid env: carry line, wall scans, then objects.
    `view`: the `image` of the observation minigrid just returned, which is this encoded view
    (computing it again was a third of a lock-step's env time)."""
    if view is None:  # the encoded egocentric view, `view[vx][vy] = (type, color, state)`
        grid, vis_mask = env.gen_obs_grid()
        view = grid.encode(vis_mask)
    carried = env.carrying
    carry = [f"You carry a {carried.color} {carried.type}"] if carried is not None else []
    return carry + _wall_lines(view) + _object_lines(view)


def observation_text(lines: list[str]) -> str:
    """The text the model sees: lines joined by newlines, without the `You see ` prefixes."""
    return "\n".join(line.replace("You see ", "") for line in lines)
