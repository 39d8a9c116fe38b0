"""A width x height grid of cell stacks; every rule of the game only looks at the top of a stack."""

from __future__ import annotations

from collections.abc import Iterator

from longturn.envs.babaisai.objects import WorldObject, border


class Grid:
    """Cells hold lists bottom -> top; (x, y) with x to the right and y downward."""

    def __init__(self, width: int, height: int) -> None:
        if width < 3 or height < 3:
            raise ValueError(f"grid {width}x{height} is too small for a border frame")
        self.width = width
        self.height = height
        self._cells: list[list[WorldObject]] = [[] for _ in range(width * height)]

    @classmethod
    def with_border(cls, width: int, height: int) -> Grid:
        """An empty room framed by immovable border walls."""
        grid = cls(width, height)
        for x, y in grid.positions():
            if x in (0, width - 1) or y in (0, height - 1):
                grid.put(x, y, border())
        return grid

    def stack(self, x: int, y: int) -> list[WorldObject]:
        return self._cells[y * self.width + x]

    def top(self, x: int, y: int) -> WorldObject | None:
        cell = self._cells[y * self.width + x]
        return cell[-1] if cell else None

    def put(self, x: int, y: int, obj: WorldObject) -> None:
        """Stack `obj` on top of cell (x, y)."""
        self._cells[y * self.width + x].append(obj)

    def pop(self, x: int, y: int) -> WorldObject:
        return self._cells[y * self.width + x].pop()

    def is_empty(self, x: int, y: int) -> bool:
        return not self._cells[y * self.width + x]

    def positions(self) -> Iterator[tuple[int, int]]:
        """All cells in row-major order (the scan order of rules, moves and text)."""
        for y in range(self.height):
            for x in range(self.width):
                yield x, y

    def find(self, name: str, kind: str) -> list[tuple[int, int]]:
        """Cells holding an object of that name and kind anywhere in their stack, row-major."""
        return [
            (x, y) for x, y in self.positions()
            if any(o.kind == kind and o.name == name for o in self.stack(x, y))
        ]

    def copy(self) -> Grid:
        """A deep copy: new object instances, same stacking."""
        twin = Grid(self.width, self.height)
        twin._cells = [[o.copy() for o in cell] for cell in self._cells]
        return twin
