"""The tiny random LLaVA the vision tests run on (CLIP tower 32×32 px, 16 tokens per image; a
2-layer Llama on the SmolLM2 tokenizer plus `<image>`), built from configs: no download.

Why here: bench/tiny_model.py holds its one definition, so `bench/tiny_model.py --llava` builds
for a reader exactly what the tests run. bench/ is not a package, so its folder joins sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from tiny_model import TOKENS_PER_IMAGE, build_tiny_llava  # noqa: E402

__all__ = ["TOKENS_PER_IMAGE", "build_tiny_llava"]
