"""The `BabyAI-MixedTrainLocal` level (BALROG/Verlog) rebuilt on upstream minigrid's `LevelGen`.

Upstream minigrid lacks this level; the task kind is a constructor argument here instead of the
reference fork's unseeded draw. Random draws are made in the reference order so a seed gives the
reference layout (SPEC_babyai_text.md §6).
"""

from __future__ import annotations

from typing import Any

from minigrid.core.roomgrid import RoomGrid
from minigrid.core.world_object import WorldObj
from minigrid.envs.babyai.core.levelgen import LevelGen
from minigrid.envs.babyai.core.roomgrid_level import RejectSampling
from minigrid.envs.babyai.core.verifier import (
    AfterInstr,
    BeforeInstr,
    GoToInstr,
    ObjDesc,
    OpenInstr,
    PickupInstr,
    PutNextInstr,
)

TASKS: tuple[str, ...] = ("goto", "pickup", "open", "putnext", "pick_up_seq_go_to")

# Colour/type pairs held out of training missions by the original level.
HELD_OUT_SUBSTRINGS: tuple[str, ...] = (
    "yellow box",
    "red key",
    "red door",
    "green ball",
    "grey door",
)

# Locked-door colours of the `open` kind (red and grey would be held out anyway).
DOOR_COLORS: tuple[str, ...] = ("yellow", "green", "blue", "purple")

# Objects generated per single-room kind, on top of `num_dists`.
_EXTRA_OBJECTS = {"goto": 1, "pickup": 1, "putnext": 2, "pick_up_seq_go_to": 2}


class MixedTrainLocalLevel(LevelGen):
    """One task kind of MixedTrainLocal; `max_steps=None` keeps upstream's 64/128 rule."""

    def __init__(self, kind: str, num_dists: int = 0, **kwargs: Any) -> None:
        self.kind = kind  # one of TASKS, as the env checks
        super().__init__(
            room_size=8,
            num_rows=1,
            num_cols=2 if kind == "open" else 1,
            num_dists=num_dists,
            locked_room_prob=0,
            locations=False,
            unblocking=False,
            implicit_unlock=False,
            action_kinds=(kind,),
            instr_kinds=("action",),
            **kwargs,
        )

    def gen_mission(self) -> None:
        """Sample until accepted; validation is retried here so upstream never prints a rejection."""
        sample = self._sample_open if self.kind == "open" else self._sample_single_room
        while True:
            self.locked_room = None
            while not sample():
                pass
            try:
                self.validate_instrs(self.instrs)
                return
            except RejectSampling:
                # Upstream's own retry rebuilds the room grid before calling gen_mission again.
                self._fresh_rooms()

    def _fresh_rooms(self) -> None:
        """Empty walled rooms, agent provisionally in the middle (upstream room-grid layout)."""
        RoomGrid._gen_grid(self, self.width, self.height)

    def _held_out(self) -> bool:
        mission = self.instrs.surface(self)
        return any(sub in mission for sub in HELD_OUT_SUBSTRINGS)

    def _sample_single_room(self) -> bool:
        """One attempt for goto/pickup/putnext/seq; True if reachable and not held out."""
        self._fresh_rooms()
        self.place_agent()
        objs = self.add_distractors(
            num_distractors=self.num_dists + _EXTRA_OBJECTS[self.kind], all_unique=False
        )
        reachable = self.check_objs_reachable(raise_exc=False)
        first = self._rand_elem(objs)
        if self.kind == "goto":
            self.instrs = GoToInstr(_desc(first))
        elif self.kind == "pickup":
            self.instrs = PickupInstr(_desc(first))
        else:
            second = self._pick_second(first, objs)
            if self.kind == "putnext":
                self.instrs = PutNextInstr(_desc(first), _desc(second))
            elif self._rand_elem(("Before", "After")) == "Before":
                self.instrs = BeforeInstr(PickupInstr(_desc(first)), GoToInstr(_desc(second)))
            else:
                self.instrs = AfterInstr(GoToInstr(_desc(second)), PickupInstr(_desc(first)))
        return reachable and not self._held_out()

    def _pick_second(self, first: WorldObj, objs: list[WorldObj]) -> WorldObj:
        """Second object; redrawn while it would make a description refer to a single object twice."""
        second = self._rand_elem(objs)
        if _same_kind(first, second) and self._count_like(first) < 2:
            while _same_kind(first, second):
                second = self._rand_elem(objs)
        return second

    def _count_like(self, obj: WorldObj) -> int:
        return sum(1 for cell in self.grid.grid if cell is not None and _same_kind(cell, obj))

    def _sample_open(self) -> bool:
        """One attempt for the two-room `open` kind; True if every object is reachable."""
        self._fresh_rooms()
        color = self._rand_elem(DOOR_COLORS)
        self._add_locked_room(color)
        self.connect_all()
        for i in range(self.num_cols):
            if self.get_room(i, 0) is not self.locked_room:
                self.add_distractors(i, 0, num_distractors=self.num_dists, all_unique=False)
        while True:
            self.place_agent()
            if self.room_from_pos(*self.agent_pos) is not self.locked_room:
                break
        reachable = self.check_objs_reachable(raise_exc=False)
        self.instrs = OpenInstr(ObjDesc("door", self._rand_elem((None, color))))
        return reachable and not self._held_out()

    def _add_locked_room(self, color: str) -> None:
        """A locked `color` door on an inner wall and its key in another room (upstream has no colour arg)."""
        while True:
            i = self._rand_int(0, self.num_cols)
            j = self._rand_int(0, self.num_rows)
            door_idx = self._rand_int(0, 4)
            self.locked_room = self.get_room(i, j)
            if self.locked_room.neighbors[door_idx] is not None:
                break
        door, _ = self.add_door(i, j, door_idx, color=color, locked=True)
        while True:
            i = self._rand_int(0, self.num_cols)
            j = self._rand_int(0, self.num_rows)
            if self.get_room(i, j) is not self.locked_room:
                break
        self.add_object(i, j, "key", door.color)


def _desc(obj: WorldObj) -> ObjDesc:
    return ObjDesc(obj.type, obj.color)


def _same_kind(a: WorldObj, b: WorldObj) -> bool:
    return a.type == b.type and a.color == b.color
