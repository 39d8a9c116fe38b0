"""Process set-up around torch.distributed and DeepSpeed."""

import os
import time
from pathlib import Path

import pytest

from longturn.distributed import (STALE_BUILD_LOCK_S, build_comm_op, clear_stale_build_locks,
                                  extensions_root)


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


def test_the_comm_op_make_install_builds_is_the_one_a_stage_loads():
    """`make install` builds it where the first DeepSpeed engine looks, so no stage pays it."""
    assert build_comm_op()
    assert list(extensions_root().glob("**/deepspeed_shm_comm*.so"))


def test_ops_are_built_by_this_venvs_ninja_whatever_path_says(monkeypatch):
    """A system ninja first on PATH rebuilt the op that the venv's ninja had built (their build
    logs hash commands differently): every build and load goes through the venv's own."""
    import sys

    own = Path(sys.executable).parent
    if not (own / "ninja").is_file():
        pytest.skip("this venv has no ninja of its own (requirements.lock pins one)")
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", "/bin"]))
    assert build_comm_op()
    assert os.environ["PATH"].split(os.pathsep)[0] == str(own)


def test_ops_are_built_in_this_venv_unless_told_otherwise(monkeypatch, tmp_path):
    """Two checkouts' venvs no longer rebuild each other's op in ~/.cache; an explicit
    TORCH_EXTENSIONS_DIR still wins."""
    import sys

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    if sys.prefix != sys.base_prefix:
        assert extensions_root() == Path(sys.prefix) / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert extensions_root() == tmp_path


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


def test_a_stage_destroys_its_process_group_before_it_exits(tmp_path):
    """NCCL's teardown at interpreter exit hung a finished stage on an H200; the group is
    destroyed by an exit hook instead, before the rendezvous dir it met through is removed."""
    import subprocess
    import sys

    code = """if True:
        import atexit
        import torch.distributed as dist
        from longturn.distributed import init_distributed
        # registered first, so it runs last: after every hook init_distributed registers
        atexit.register(lambda: print("at exit: initialized", dist.is_initialized()))
        print("world", init_distributed("cpu"))
    """
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "world (0, 1)" in out.stdout and "at exit: initialized False" in out.stdout
    assert "destroy_process_group() was not called" not in out.stderr
    assert list(tmp_path.glob("longturn-dist-*")) == []


def test_a_cpu_stage_tells_deepspeed_its_accelerator():
    """Left to detect it, DeepSpeed warned in every CPU stage's log that it found no GPU."""
    import subprocess
    import sys

    code = """if True:
        import torch
        from longturn.device import pin_accelerator
        pin_accelerator(torch.device("cpu"))
        from deepspeed.accelerator import get_accelerator
        print("accelerator", get_accelerator().device_name())
    """
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "accelerator cpu" in out.stdout
    assert "unable to detect" not in out.stdout + out.stderr, out.stdout + out.stderr


def test_rendezvous_dir_of_a_sigkilled_process_is_swept_by_the_next_one(tmp_path):
    """atexit never runs after SIGKILL; the next plain process removes the dir it left."""
    import signal
    import subprocess
    import sys

    killed = ("import os, signal, torch.distributed as dist; "
              "from longturn.distributed import _single_process_init_method as f; "
              "dist.init_process_group('gloo', init_method=f(), rank=0, world_size=1); "
              "print('met', flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    clean = "from longturn.distributed import _single_process_init_method as f; print(f())"
    temp = tmp_path / "a temp dir"  # a space: the init method must still name the real file
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    proc = subprocess.run([sys.executable, "-c", killed], env=env, capture_output=True, text=True,
                          timeout=60)  # a rendezvous path torch cannot open waits forever
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "met\n", proc.stderr[-2000:]
    assert len(list(temp.glob("longturn-dist-*"))) == 1  # the litter a kill leaves
    subprocess.run([sys.executable, "-c", clean], env=env, check=True, capture_output=True)
    assert list(temp.glob("longturn-dist-*")) == []


def test_rendezvous_dirs_of_live_processes_and_other_hosts_are_kept(tmp_path):
    from longturn.distributed import _rendezvous_owner, clear_stale_rendezvous_dirs

    live = tmp_path / f"longturn-dist-{_rendezvous_owner()}-abcd1234"
    elsewhere = tmp_path / "longturn-dist-1.another-host-abcd1234"
    for path in (live, elsewhere):
        path.mkdir()
    assert clear_stale_rendezvous_dirs(tmp_path) == []
    assert live.is_dir() and elsewhere.is_dir()
