"""Per-prompt sampling seeds, shared by every engine so a seeded call means the same everywhere."""

from __future__ import annotations

_MASK64 = (1 << 64) - 1


def row_seed(seed: int, index: int) -> int:
    """SplitMix64 of (seed, index): independent-looking streams for neighbouring prompts.

    A prompt's seed depends only on the call's seed and its index in the call, never on how the
    engine batches it."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)
