"""The turn grid: rows in any order back on their [steps, slots] cells, each turn's successor in
its episode, holes where a slot had no turn, and the order GAE sweeps."""

from __future__ import annotations

import numpy as np
import pytest

from longturn.algo.turn_grid import TurnGrid


def test_cells_successors_and_holes() -> None:
    # slot 0: episode a (steps 0, 1), then b (step 2); slot 5: episode c (step 0), then no turn
    # (its group episode ended), iteration 1 starts a new block: slot 0 step 0 continues b
    rows = [(5, 0, "c", 0), (0, 1, "a", 0), (0, 0, "a", 0), (0, 2, "b", 0), (0, 0, "b", 1)]
    env, step, episode, iteration = map(list, zip(*rows))
    grid = TurnGrid.build(env, step, episode, iteration)
    assert grid.slots.tolist() == [0, 5]
    assert grid.cells.tolist() == [[2, 0], [1, -1], [3, -1], [4, -1]]
    # a → a; a's last turn and b differ; nothing links across iterations or into a hole
    assert grid.next_row.tolist() == [-1, -1, 1, -1, -1]
    assert grid.slot_major_order().tolist() == [2, 1, 3, 4, 0]


def test_a_shared_cell_is_refused() -> None:
    with pytest.raises(ValueError, match="two turns share env_index=3 step=1"):
        TurnGrid.build([3, 3], [1, 1], ["x", "y"])


def test_shuffled_rows_give_the_same_links() -> None:
    rng = np.random.default_rng(0)
    env = np.repeat(np.arange(4), 5)
    step = np.tile(np.arange(5), 4)
    episode = [f"{e}-{s // 3}" for e, s in zip(env, step)]  # a new episode at step 3
    base = TurnGrid.build(env, step, episode).next_row
    perm = rng.permutation(len(env))
    shuffled = TurnGrid.build(env[perm], step[perm], [episode[i] for i in perm]).next_row
    inverse = np.argsort(perm)
    mapped = np.where(shuffled >= 0, perm[np.maximum(shuffled, 0)], -1)
    assert mapped[inverse].tolist() == base.tolist()
