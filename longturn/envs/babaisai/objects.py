"""The objects of a BabaIsAI grid: movable things, text (rule) blocks and the border frame.

One small mutable class serves all three kinds: the engine needs object identity (a thing keeps its
facing and per-step `moved` flag while it travels between cell stacks), nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

THING = "thing"
BLOCK = "block"
BORDER = "border"

# Display names of the movable things (the original's internal `fball`, `fkey`, ... minus the `f`).
THING_NAMES: tuple[str, ...] = ("baba", "ball", "key", "door", "wall")
NOUN_WORDS: tuple[str, ...] = THING_NAMES
IS_WORD = "is"
PROPERTY_WORDS: tuple[str, ...] = (
    "you", "win", "stop", "push", "lose", "pull", "move", "open", "shut",
)
BLOCK_WORDS: tuple[str, ...] = NOUN_WORDS + (IS_WORD,) + PROPERTY_WORDS

# Facing of a new thing: to the right (the original's direction 0).
DEFAULT_FACING: tuple[int, int] = (1, 0)


@dataclass(eq=False, slots=True)
class WorldObject:
    """A thing, a text block or a border wall; `name` is the thing name or the block's word."""

    kind: str
    name: str
    facing: tuple[int, int] = DEFAULT_FACING
    moved: bool = False

    @property
    def is_thing(self) -> bool:
        return self.kind == THING

    @property
    def is_block(self) -> bool:
        return self.kind == BLOCK

    @property
    def is_noun_block(self) -> bool:
        return self.kind == BLOCK and self.name in NOUN_WORDS

    @property
    def is_is_block(self) -> bool:
        return self.kind == BLOCK and self.name == IS_WORD

    @property
    def is_property_block(self) -> bool:
        return self.kind == BLOCK and self.name in PROPERTY_WORDS

    @property
    def key(self) -> str:
        """A short hashable label (search states, tests): `baba`, `IS`, `#`."""
        if self.kind == BORDER:
            return "#"
        return self.name.upper() if self.kind == BLOCK else self.name

    def copy(self) -> WorldObject:
        return WorldObject(self.kind, self.name, self.facing, self.moved)


def thing(name: str) -> WorldObject:
    if name not in THING_NAMES:
        raise ValueError(f"unknown thing {name!r}; things are {THING_NAMES}")
    return WorldObject(THING, name)


def block(word: str) -> WorldObject:
    if word not in BLOCK_WORDS:
        raise ValueError(f"unknown text block {word!r}; words are {BLOCK_WORDS}")
    return WorldObject(BLOCK, word)


def border() -> WorldObject:
    return WorldObject(BORDER, "border")
