"""Save/restore the python, numpy and torch RNG states of one rank, so a resumed run continues
the same random streams (sampling seeds, shuffles) as an uninterrupted one."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _as_tuples(x: Any) -> Any:
    """random.setstate wants nested tuples; a round trip may hand back lists."""
    return tuple(_as_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


def save_rng_states(path: str | Path) -> Path:
    """Write this process's RNG states atomically, as plain containers and tensors (loadable
    with weights_only)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(np.array(keys, dtype=np.int64)), int(pos),
                  int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(states, tmp)
    os.replace(tmp, path)
    return path


def load_rng_states(path: str | Path) -> None:
    states = torch.load(Path(path), weights_only=True)
    random.setstate(_as_tuples(states["python"]))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
