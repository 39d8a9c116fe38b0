"""Per-prompt sampling seeds, shared by every engine so a seeded call means the same everywhere."""

from __future__ import annotations

import hashlib
from typing import Sequence

_MASK64 = (1 << 64) - 1


def row_seed(seed: int, index: int) -> int:
    """SplitMix64 of (seed, index): independent-looking streams for neighbouring prompts.

    A prompt's seed depends only on the call's seed and its index in the call, never on how the
    engine batches it."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def lock_step_seed(seed: int | None, iteration: int, step: int) -> int | None:
    """The seed of one lock-step of a collection (every running episode's reply in one call):
    one rule for every player, so every collection's replies follow from the run's seed, the
    iteration and the lock-step alone (None: unseeded)."""
    return None if seed is None else seed + iteration * 100_003 + step


def keyed_seed(seed: int, key: str) -> int:
    """The seed of one named stream (an evaluation episode) under a run's seed: a function of the
    two alone, so the stream does not change with what else was played before or beside it."""
    digest = hashlib.sha256(key.encode()).digest()
    return row_seed(seed, int.from_bytes(digest[:8], "little"))


def episode_turn_seed(seed: int, episode_id: str, turn: int) -> int:
    """The seed of one reply of an evaluation's episode: a function of the run's seed, the
    episode's id and the reply's turn alone, so an episode samples the same whichever episodes
    share its lock-steps and whichever player plays it."""
    return row_seed(keyed_seed(seed, episode_id), turn)


def prompt_seeds(seed: int | Sequence[int], count: int) -> list[int]:
    """Each prompt's seed in a call of `count` prompts: `row_seed(seed, i)`, or `seed[i]` when
    the caller gave one seed per prompt (episodes that carry their own streams)."""
    if not isinstance(seed, (list, tuple)):
        return [row_seed(int(seed), i) for i in range(count)]
    if len(seed) != count:
        raise ValueError(f"{len(seed)} sampling seeds for {count} prompts: give one per prompt")
    return [int(s) & ((1 << 63) - 1) for s in seed]
