"""PyPI `crafter` 1.8.3, made reproducible across processes and seedable per episode.

crafter picks the creature to despawn from a list built out of a set whose order follows memory
addresses; creatures draw from the world RNG, so two processes with the same seed and actions
drift apart. Here the candidates are sorted by their slot in the world's object table first.
site-packages stays untouched: this is a subclass.
"""

from __future__ import annotations

from typing import Any

import crafter


class ReproducibleCrafter(crafter.Env):
    """crafter.Env whose object balancing does not depend on memory addresses."""

    def _balance_object(self, chunk: Any, objs: Any, *args: Any, **kwargs: Any) -> None:
        slot_map = self._world._obj_map
        ordered = sorted(objs, key=lambda obj: int(slot_map[tuple(obj.pos)]))
        super()._balance_object(chunk, ordered, *args, **kwargs)

    def reseed(self, seed: int) -> None:
        """Make the next `reset()` build the world crafter builds for its first episode with
        `crafter.Env(seed=seed)`, whatever happened before."""
        self._seed = int(seed)
        self._episode = 0

    @property
    def base_seed(self) -> int:
        return int(self._seed)

    @property
    def episode(self) -> int:
        return int(self._episode)

    @property
    def player(self) -> Any:
        return self._player

    @property
    def step_count(self) -> int:
        return int(self._step)
