"""`show --frames DIR`: a sample's image observations written back out as the PNG bytes stored
(no re-encoding), so what the model was shown can be looked at."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def write_frames(images: Sequence[bytes], stem: str, frames_dir: str | Path) -> list[Path]:
    """`<stem>-<k>.png` for image k of the sample, in the order of its `<image>` placeholders."""
    out = Path(frames_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}-{k}.png" for k in range(len(images))]
    for path, png in zip(paths, images):
        path.write_bytes(png)
    return paths
