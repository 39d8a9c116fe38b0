"""The BabaIsAI rules engine: one step = YOU things move, MOVE things move, rules are re-read.

Follows SPEC_babaisai.md §2-§4 exactly, quirks included (blocked PUSH things are enterable, pull
happens even when the mover is blocked, win/lose use the rules from before the step).
"""

from __future__ import annotations

from dataclasses import dataclass

from longturn.envs.babaisai.grid import Grid
from longturn.envs.babaisai.objects import thing
from longturn.envs.babaisai.rules import RuleSet, parse_rules

MAX_STEPS = 100
IDLE = 0
# action int -> (dx, dy); 0 = idle has none
DIRECTIONS: dict[int, tuple[int, int]] = {1: (0, -1), 2: (1, 0), 3: (0, 1), 4: (-1, 0)}


@dataclass(frozen=True)
class StepOutcome:
    reward: float
    done: bool
    won: bool
    lost: bool


class BabaGame:
    """A level in play: the grid, the active rules and the step counter."""

    def __init__(self, grid: Grid, max_steps: int = MAX_STEPS) -> None:
        self.grid = grid
        self.max_steps = max_steps
        self.steps = 0
        self.rules: RuleSet = parse_rules(grid)

    def step(self, action: int) -> StepOutcome:
        """Apply action 0 idle, 1 up, 2 right, 3 down, 4 left."""
        if action != IDLE and action not in DIRECTIONS:
            raise ValueError(f"invalid action {action!r}: use 0..4")
        self.steps += 1
        reward, done, won, lost = 0.0, False, False, False
        if action != IDLE:
            won, lost = self._move_everything(DIRECTIONS[action])
            if won:
                reward = 1 - 0.9 * (self.steps / self.max_steps)
                done = True
            elif lost:
                reward = -1.0
                done = True
            self.rules = parse_rules(self.grid)
            self._apply_replacements()
        if self.steps >= self.max_steps:
            done = True
        return StepOutcome(reward, done, won, lost)

    def _move_everything(self, direction: tuple[int, int]) -> tuple[bool, bool]:
        """YOU things in row-major order, then MOVE things; the last YOU mover's win/lose count."""
        grid, rules = self.grid, self.rules
        for x, y in grid.positions():
            top = grid.top(x, y)
            if rules.has(top, "you") or rules.has(top, "move"):
                top.moved = False
        won = lost = False
        for x, y in grid.positions():
            top = grid.top(x, y)
            if rules.has(top, "you") and not top.moved:
                top.facing = direction
                won, lost = self._move((x, y), direction)
                top.moved = True
        for x, y in grid.positions():
            top = grid.top(x, y)
            if rules.has(top, "move") and not top.moved:
                self._move((x, y), top.facing)
                top.moved = True
        return won, lost

    def _move(self, source: tuple[int, int], d: tuple[int, int]) -> tuple[bool, bool]:
        """Move the top of `source` one cell along `d` (SPEC §3.1): push, stop, pull, open/shut."""
        grid, rules = self.grid, self.rules
        front_cell = (source[0] + d[0], source[1] + d[1])
        front, mover = grid.top(*front_cell), grid.top(*source)
        if _opens(rules, mover, front) or _opens(rules, front, mover):
            grid.pop(*source)
            grid.pop(*front_cell)
        if front is not None and (front.is_block or rules.has(front, "push")):
            self._move(front_cell, d)
        blocker = grid.top(*front_cell)
        enterable = blocker is None or (blocker.is_thing and not rules.has(blocker, "stop"))
        dest = front_cell if enterable else source
        arrived_on = grid.top(*dest)
        won, lost = rules.has(arrived_on, "win"), rules.has(arrived_on, "lose")
        if dest != source and grid.top(*source) is not None:
            moving = grid.pop(*source)
            grid.put(*dest, moving)
            moving.facing = d
        behind = (source[0] - d[0], source[1] - d[1])
        if rules.has(grid.top(*behind), "pull"):
            self._move(behind, d)
        return won, lost

    def _apply_replacements(self) -> None:
        """`A IS B`: stack a fresh B on every cell whose top is an A thing (the A stays below)."""
        for subject, target in self.rules.replacement_pairs():
            for x, y in self.grid.positions():
                top = self.grid.top(x, y)
                if top is not None and top.is_thing and top.name == subject:
                    self.grid.put(x, y, thing(target))


def _opens(rules: RuleSet, opener, shut_one) -> bool:
    return rules.has(opener, "open") and rules.has(shut_one, "shut")
