"""Pruning keeps the newest intact checkpoints: a damaged newer one never pushes out the one a
resume would fall back to."""

from __future__ import annotations

import os
from pathlib import Path

from longturn.run.checkpoints import CheckpointStore, iteration_dir


class FilesTrainer:
    """What CheckpointStore.write needs of a trainer: files under a dir, a rank, a digest."""

    rank = 0

    def save_checkpoint(self, directory: Path, client_state: dict) -> None:
        (directory / "actor").mkdir(parents=True)
        (directory / "actor/weights.bin").write_bytes(os.urandom(4096))

    def weights_digest(self) -> str:
        return "0" * 64


def save(store: CheckpointStore, iteration: int) -> Path:
    store.write(FilesTrainer(), b"collector", iteration)
    return store.commit(iteration, [{"iteration": iteration}])


def truncate(ckpt: Path) -> None:
    """The damage `verify` detects first: a file shorter than its manifest says."""
    os.truncate(ckpt / "actor/weights.bin", 100)


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_a_damaged_newest_checkpoint_does_not_push_out_the_intact_one(tmp_path):
    store = CheckpointStore(tmp_path, keep=1)
    save(store, 0)
    store.keep = 2
    save(store, 1)
    store.keep = 1
    truncate(iteration_dir(tmp_path, 1))
    store._prune()
    assert names(tmp_path) == ["iteration=0000", "iteration=0001"]
    assert store.latest() == iteration_dir(tmp_path, 0)


def test_damaged_checkpoints_do_not_count_toward_keep(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    save(store, 0)
    save(store, 1)
    truncate(iteration_dir(tmp_path, 1))  # a bad disk, after it was committed
    save(store, 2)
    assert names(tmp_path) == ["iteration=0000", "iteration=0001", "iteration=0002"]
    truncate(iteration_dir(tmp_path, 2))
    assert store.latest() == iteration_dir(tmp_path, 0)


def test_checkpoints_older_than_the_kept_intact_ones_are_deleted(tmp_path):
    store = CheckpointStore(tmp_path, keep=1)
    save(store, 0)
    store.keep = 3
    save(store, 1)
    save(store, 2)
    truncate(iteration_dir(tmp_path, 0))
    store.keep = 1
    save(store, 3)
    assert names(tmp_path) == ["iteration=0003"]
