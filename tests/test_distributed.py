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


def test_single_process_rendezvous_directory_is_removed_at_exit(tmp_path):
    """A plain process meets itself through a file store in a temp dir; the dir goes at exit."""
    import subprocess
    import sys

    code = "from longturn.distributed import _single_process_init_method as f; print(f())"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("file://") and str(tmp_path) in out
    assert list(tmp_path.glob("longturn-dist-*")) == []
