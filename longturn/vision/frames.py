"""Frames as PNG bytes: how image observations are kept in the samples Parquet (lossless, a few
hundred bytes for a BabyAI view) and read back for the update."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def to_png(frame: np.ndarray) -> bytes:
    """An RGB uint8 [H, W, 3] frame as PNG bytes."""
    array = np.asarray(frame)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[-1] != 3:
        raise ValueError(f"an image observation must be uint8 [H, W, 3], got {array.dtype} "
                         f"{list(array.shape)}")
    out = io.BytesIO()
    Image.fromarray(array, "RGB").save(out, format="PNG")
    return out.getvalue()


def from_png(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))
