"""A plan-guided search solver: follows a level's target_plan (break / make / goto), one subgoal
at a time, with a weighted best-first search over real engine states. An oracle for tests and
baselines (it lives with the tests: nothing in the library plays by it).
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections.abc import Callable, Hashable, Iterator

from longturn.envs.babaisai.game import BabaGame
from longturn.envs.babaisai.grid import Grid
from longturn.envs.babaisai.objects import BLOCK

MOVES = (1, 2, 3, 4)  # up, right, down, left
LOST_TARGET = 50  # heuristic when the subgoal's target has vanished (e.g. the WIN rule was broken)
GREED = 2  # weight of the heuristic against path length (weighted A*)
PLAN_STEP = re.compile(r"(goto|break|make)\[([^\]]*)\]")
Subgoal = tuple[str, str]  # ("goto", noun) | ("break"/"make", "noun is prop")


def you_positions(game: BabaGame) -> list[tuple[int, int]]:
    """Cells whose top thing is YOU, row-major."""
    return [p for p in game.grid.positions() if game.rules.has(game.grid.top(*p), "you")]


def copy_game(game: BabaGame) -> BabaGame:
    """An independent game in the same state (the rule set is immutable: shared)."""
    twin = BabaGame.__new__(BabaGame)
    twin.grid, twin.max_steps, twin.steps, twin.rules = (
        game.grid.copy(), game.max_steps, game.steps, game.rules)
    return twin


def parse_plan(target_plan: str) -> list[Subgoal]:
    """`break[wall is stop], goto[ball]` -> [("break", "wall is stop"), ("goto", "ball")]."""
    return [(m.group(1), m.group(2).strip()) for m in PLAN_STEP.finditer(target_plan)]


def solve(
    game: BabaGame, target_plan: str, max_nodes: int = 5000, alternatives: int = 4,
) -> list[int] | None:
    """Engine actions that win from `game` (left untouched), or None when the search gives up.

    When a later subgoal fails, up to `alternatives` other ways of reaching an earlier one are
    tried (e.g. breaking WALL IS STOP by pushing a different block). States are first told apart
    only by what the subgoal names (fast); if that fails, by the whole grid (slower, thorough)."""
    subgoals = parse_plan(target_plan)
    for focused, budget in ((True, max_nodes), (False, 4 * max_nodes)):
        actions = _solve_from(copy_game(game), subgoals, budget, alternatives, focused)
        if actions is not None and _won_last(game, actions):
            return actions
    return None


def _solve_from(
    state: BabaGame, subgoals: list[Subgoal], max_nodes: int, alternatives: int, focused: bool,
) -> list[int] | None:
    """Depth-first over subgoals, best-first within each; backtracks into earlier alternatives."""
    if not subgoals:
        return []
    kind, argument = subgoals[0]
    found = _search(state, _goal(kind, argument), _heuristic(kind, argument),
                    _state_key(kind, argument) if focused else _grid_key, max_nodes)
    for _, (reached, path) in zip(range(alternatives), found):
        rest = _solve_from(reached, subgoals[1:], max_nodes, alternatives, focused)
        if rest is not None:
            return path + rest
    return None


def _won_last(game: BabaGame, actions: list[int]) -> bool:
    replay = copy_game(game)
    outcome = None
    for action in actions:
        outcome = replay.step(action)
    return outcome is not None and outcome.won


def _search(
    start: BabaGame, goal: Callable[[BabaGame, bool], bool], heuristic: Callable[[BabaGame], int],
    state_key: Callable[[BabaGame], Hashable], max_nodes: int,
) -> Iterator[tuple[BabaGame, list[int]]]:
    """Weighted best-first (g + GREED h), yielding each distinct goal state it meets (goal states
    are not expanded); dead ends (no YOU thing, episode over) are dropped. States are told apart
    by `state_key`; a focused key ignores blocks the subgoal does not name (fewer states, rarely
    a lost path)."""
    counter = itertools.count()
    frontier = [(GREED * heuristic(start), next(counter), start, [])]
    seen = {state_key(start)}
    while frontier and len(seen) < max_nodes:
        _, _, state, path = heapq.heappop(frontier)
        for action in MOVES:
            child = copy_game(state)
            outcome = child.step(action)
            key = state_key(child)
            if key in seen:
                continue
            seen.add(key)
            if goal(child, outcome.won):
                yield child, path + [action]
                continue
            if outcome.done or not you_positions(child):
                continue
            priority = len(path) + 1 + GREED * heuristic(child)
            heapq.heappush(frontier, (priority, next(counter), child, path + [action]))


def _goal(kind: str, argument: str) -> Callable[[BabaGame, bool], bool]:
    if kind == "goto":
        return lambda game, won: won
    rule = tuple(argument.split(" is "))
    if kind == "make":
        return lambda game, won: rule in game.rules.pairs() and bool(you_positions(game))
    return lambda game, won: rule not in game.rules.pairs() and bool(you_positions(game))


def _state_key(kind: str, argument: str) -> Callable[[BabaGame], Hashable]:
    """YOU cells, the active rules and (break/make) where the rule's noun/property blocks lie."""
    words = set(argument.split(" is ")) if kind != "goto" else set()

    def key(game: BabaGame) -> Hashable:
        named = tuple(
            (x, y, o.name) for x, y in game.grid.positions() for o in game.grid.stack(x, y)
            if o.is_block and o.name in words
        )
        return tuple(you_positions(game)), tuple(game.rules.pairs()), named

    return key


def _grid_key(game: BabaGame) -> Hashable:
    """The whole grid: every stack's kinds and names, row-major."""
    grid = game.grid
    return tuple(tuple(o.key for o in grid.stack(x, y)) for x, y in grid.positions())


def _heuristic(kind: str, argument: str) -> Callable[[BabaGame], int]:
    if kind == "goto":
        return _distance_to_win
    noun, prop = argument.split(" is ")
    if kind == "make":
        return lambda game: _make_distance(game, noun, prop)
    return lambda game: _break_distance(game, noun, prop)


def _manhattan(a: tuple[int, int], b: tuple[int, int]) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def _nearest(sources: list[tuple[int, int]], targets: list[tuple[int, int]]) -> int:
    return min((_manhattan(s, t) for s in sources for t in targets), default=0)


def _distance_to_win(game: BabaGame) -> int:
    wins = [p for p in game.grid.positions() if game.rules.has(game.grid.top(*p), "win")]
    return _nearest(you_positions(game), wins) if wins else LOST_TARGET


def _break_distance(game: BabaGame, noun: str, prop: str) -> int:
    rules = game.rules.properties
    cells = [c for r in rules if (r.subject, r.word) == (noun, prop) for c in r.cells]
    return max(_nearest(you_positions(game), cells) - 1, 0)


def _make_distance(game: BabaGame, noun: str, prop: str) -> int:
    """3 x (noun block to a free subject slot) + (YOU to the noun block)."""
    slots = _subject_slots(game.grid, prop)
    nouns = game.grid.find(noun, BLOCK)
    if not slots or not nouns:
        return LOST_TARGET
    best = min((3 * _manhattan(n, s), n) for n in nouns for s in slots)
    return best[0] + _nearest(you_positions(game), [best[1]])


def _subject_slots(grid: Grid, prop: str) -> list[tuple[int, int]]:
    """Cells where a noun block would complete `noun IS prop`, the IS/prop blocks as they lie."""
    slots = []
    for x, y in grid.positions():
        top = grid.top(x, y)
        if top is None or not top.is_is_block:
            continue
        right = grid.top(x + 1, y) if x + 1 < grid.width else None
        below = grid.top(x, y + 1) if y + 1 < grid.height else None
        if right is not None and right.is_block and right.name == prop and x >= 1:
            slots.append((x - 1, y))
        if below is not None and below.is_block and below.name == prop and y >= 1:
            slots.append((x, y - 1))
    return slots
