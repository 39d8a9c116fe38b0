"""Process set-up around torch.distributed and DeepSpeed."""

import os
import time

from longturn.distributed import STALE_BUILD_LOCK_S, clear_stale_build_locks


def test_stale_deepspeed_build_lock_is_removed(tmp_path):
    """A lock left by a process killed mid-build would make every later stage wait forever."""
    old = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    new = tmp_path / "py311_cpu" / "deepspeed_other" / "lock"
    for lock in (old, new):
        lock.parent.mkdir(parents=True)
        lock.touch()
    past = time.time() - 2 * STALE_BUILD_LOCK_S
    os.utime(old, (past, past))
    assert clear_stale_build_locks(tmp_path) == [old]
    assert not old.exists() and new.exists()  # a recent lock may be a build running now
