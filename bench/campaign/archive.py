"""The one archive that comes back from a GPU node, and the evidence kept in the repository.

A node returns at most 8 files of 16 MiB each, so the campaign's results folder is packed into
one .tgz of at most 16 MB (largest files left out first, and named, if it would not fit).
`keep` then copies the small outputs that are evidence (markdown, JSON, PNG curves, the GPU
samples) into docs/measurements/<date>-<profile>/; weights, traces and logs stay out of git.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from pathlib import Path

LIMIT_BYTES = 16_000_000
KEPT_SUFFIXES = {".md", ".json", ".png", ".csv"}
KEPT_MAX_BYTES = 2_000_000  # per file: a 2 MB JSON is not a metrics file


def pack(results: Path, archive: Path, limit: int = LIMIT_BYTES) -> list[str]:
    """Pack `results/` as `<archive>` (root folder named after the archive); returns what was left
    out to stay within `limit`, biggest first."""
    files = sorted((p for p in results.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    left_out: list[str] = []
    root = archive.name.removesuffix(".tgz")
    while True:
        with tarfile.open(archive, "w:gz") as tar:
            for path in files:
                tar.add(path, arcname=f"{root}/{path.relative_to(results)}")
        if archive.stat().st_size <= limit or not files:
            return left_out
        left_out.append(str(files.pop().relative_to(results)))


def keep(source: Path, dest_root: Path) -> Path:
    """Copy the evidence of an archive (or an unpacked results folder) into
    `dest_root/<its name>/`; returns that folder."""
    with tempfile.TemporaryDirectory() as tmp:
        if source.is_file():
            with tarfile.open(source) as tar:
                tar.extractall(tmp, filter="data")
            (folder,) = [p for p in Path(tmp).iterdir() if p.is_dir()]
        else:
            folder = source
        dest = dest_root / folder.name
        if dest.exists():
            shutil.rmtree(dest)
        for path in sorted(folder.rglob("*")):
            if (path.is_file() and path.suffix in KEPT_SUFFIXES
                    and path.stat().st_size <= KEPT_MAX_BYTES and "logs" not in path.parts):
                target = dest / path.relative_to(folder)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
        return dest
