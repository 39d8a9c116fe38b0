"""Numbered checkpoint directories of the train loop, each written under a temp name and renamed
into place only when complete, so a crash never leaves a checkpoint that looks finished.

Saving is two calls, so the caller can time the heavy part and record that time in the history
the checkpoint carries: `write` (engines, env slots, digests; every rank writes its part) and
`commit` (history, COMPLETE marker, rename, pruning; rank 0).
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path
from typing import Any

from longturn.distributed import barrier, is_main_process


def iteration_dir(root: Path, iteration: int) -> Path:
    return root / f"iteration={iteration:04d}"


class CheckpointStore:
    """Checkpoints under `root`, the newest `keep` complete ones kept."""

    def __init__(self, root: Path, keep: int):
        self.root, self.keep = root, keep

    def latest(self) -> Path | None:
        done = sorted(p for p in self.root.glob("iteration=*") if (p / "COMPLETE").is_file())
        return done[-1] if done else None

    def write(self, trainer: Any, collector_blob: bytes, iteration: int) -> Path:
        """Everything but the history, into iteration=NNNN.tmp (every rank writes its part)."""
        tmp = self._tmp(iteration)
        if is_main_process():
            shutil.rmtree(tmp, ignore_errors=True)
        barrier()
        trainer.save_checkpoint(tmp, {"iteration": iteration})
        (tmp / f"collector_rank{trainer.rank}.pkl").write_bytes(collector_blob)
        (tmp / f"weights_digest_rank{trainer.rank}.txt").write_text(trainer.weights_digest() + "\n")
        barrier()
        return tmp

    def commit(self, iteration: int, history: list[dict[str, float]]) -> Path:
        """Add the history, mark COMPLETE and move into place; prune old checkpoints."""
        final, tmp = iteration_dir(self.root, iteration), self._tmp(iteration)
        if is_main_process():
            (tmp / "history.pkl").write_bytes(pickle.dumps(history))
            (tmp / "COMPLETE").write_text(f"{iteration}\n")
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            self._prune()
        barrier()
        return final

    def _tmp(self, iteration: int) -> Path:
        final = iteration_dir(self.root, iteration)
        return final.with_name(final.name + ".tmp")

    def _prune(self) -> None:
        done = sorted(p for p in self.root.glob("iteration=*") if (p / "COMPLETE").is_file())
        for old in done[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob("*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
