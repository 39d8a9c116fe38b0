"""Numbered checkpoint directories of the train loop, each written under a temp name and renamed
into place only when complete, so a crash never leaves a checkpoint that looks finished.

Saving is two calls, `write` (every rank) and `commit` (rank 0), so the caller can time the heavy
part and record that time in the history the checkpoint carries. A complete checkpoint can still
be damaged later (a truncated copy, a bad disk): MANIFEST.json lists every file's size and sha256
and COMPLETE the manifest's hash, so `latest` falls back to the newest intact checkpoint, naming
the wrong file, instead of crashing inside torch.load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import shutil
from pathlib import Path
from typing import Any

from longturn.atomic import named_disk_errors
from longturn.distributed import barrier, is_main_process

log = logging.getLogger(__name__)
MANIFEST = "MANIFEST.json"
COMPLETE = "COMPLETE"


def iteration_dir(root: Path, iteration: int) -> Path:
    return root / f"iteration={iteration:04d}"


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_entries(directory: Path, skip: set[str] = frozenset()) -> dict[str, list]:
    """{relative path: [size, sha256]} of every file under `directory` but `skip`."""
    entries = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel not in skip:
            entries[rel] = [path.stat().st_size, file_sha256(path)]
    return entries


def verify(directory: Path) -> str | None:
    """Why this COMPLETE checkpoint is damaged (one phrase naming the file), or None if intact.

    Sizes are checked first (cheap, and what a truncation breaks), then hashes. A checkpoint
    from before manifests existed (no manifest, none named in COMPLETE) is taken as intact."""
    words = (directory / COMPLETE).read_text().split()
    expected = words[words.index("manifest") + 1] if "manifest" in words[:-1] else None
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return None if expected is None else f"{MANIFEST} is missing"
    if expected is not None and file_sha256(manifest) != expected:
        return f"{MANIFEST} does not match the hash in {COMPLETE}"
    try:
        entries = dict(json.loads(manifest.read_text()))
    except (ValueError, TypeError):
        return f"{MANIFEST} is not a manifest (truncated?)"
    for rel, (size, _) in entries.items():
        path = directory / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != size:
            return f"{rel} is {path.stat().st_size} bytes, the manifest says {size}"
    for rel, (_, digest) in entries.items():
        if file_sha256(directory / rel) != digest:
            return f"{rel} does not match its sha256 in the manifest"
    return None


def complete_checkpoints(root: Path) -> list[Path]:
    """The `iteration=NNNN` dirs under `root` with a COMPLETE marker, oldest first (not a
    `.tmp` dir a crash left between its marker and its rename)."""
    return sorted(p for p in root.glob("iteration=*")
                  if p.name.split("=", 1)[1].isdigit() and (p / COMPLETE).is_file())


class CheckpointStore:
    """Checkpoints under `root`, the newest `keep` intact ones kept (see `_prune`)."""

    def __init__(self, root: Path, keep: int):
        self.root, self.keep = root, keep
        self._digested: dict[int, dict[str, list]] = {}  # files hashed in write (rank 0)

    def latest(self) -> Path | None:
        """The newest complete checkpoint whose files match its manifest; damaged newer ones
        are skipped with a warning naming the file."""
        complete = complete_checkpoints(self.root)
        for ckpt in reversed(complete):
            problem = verify(ckpt)
            if problem is None:
                return ckpt
            log.warning("checkpoint %s skipped, damaged: %s", ckpt, problem)
        if complete:  # every one was skipped
            log.warning("no intact checkpoint under %s: starting from iteration 0", self.root)
        return None

    def write(self, trainer: Any, collector_blob: bytes, iteration: int) -> Path:
        """Everything but the history, into iteration=NNNN.tmp (every rank writes its part)."""
        tmp = self._tmp(iteration)
        if is_main_process():
            shutil.rmtree(tmp, ignore_errors=True)
        barrier()
        try:
            with named_disk_errors(tmp):
                trainer.save_checkpoint(tmp, {"iteration": iteration})
                (tmp / f"collector_rank{trainer.rank}.pkl").write_bytes(collector_blob)
                (tmp / f"weights_digest_rank{trainer.rank}.txt").write_text(
                    trainer.weights_digest() + "\n")
        except Exception:
            if is_main_process():  # give the space back; the complete checkpoints stay
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        barrier()
        if is_main_process():  # hashed here, inside the caller's checkpoint timing
            self._digested[iteration] = file_entries(tmp)
        return tmp

    def commit(self, iteration: int, history: list[dict[str, float]]) -> Path:
        """Add the history and the manifest, mark COMPLETE and move into place; prune old ones."""
        final, tmp = iteration_dir(self.root, iteration), self._tmp(iteration)
        if is_main_process():
            with named_disk_errors(tmp):
                (tmp / "history.pkl").write_bytes(pickle.dumps(history))
                done = self._digested.pop(iteration, {})
                entries = {**done, **file_entries(tmp, skip={*done, MANIFEST, COMPLETE})}
                (tmp / MANIFEST).write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
                (tmp / COMPLETE).write_text(f"{iteration}\nmanifest {file_sha256(tmp / MANIFEST)}\n")
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            self._prune(fresh=final)
        barrier()
        return final

    def _tmp(self, iteration: int) -> Path:
        final = iteration_dir(self.root, iteration)
        return final.with_name(final.name + ".tmp")

    def _prune(self, fresh: Path | None = None) -> None:
        """Keep the newest `keep` checkpoints that verify (and any damaged ones newer than the
        oldest of them); delete the rest. Damaged ones do not count toward `keep`, so a damaged
        newer checkpoint never pushes out the intact one a resume would fall back to. `fresh`
        was hashed in this commit and is taken as intact without hashing it again."""
        intact = 0
        for ckpt in reversed(complete_checkpoints(self.root)):
            if intact >= self.keep:
                shutil.rmtree(ckpt, ignore_errors=True)
                continue
            problem = None if ckpt == fresh else verify(ckpt)
            if problem is None:
                intact += 1
            else:
                log.warning("checkpoint %s kept but not counted toward keep=%d, damaged: %s",
                            ckpt, self.keep, problem)
        for stale in self.root.glob("*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
