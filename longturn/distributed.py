"""torch.distributed set-up that works the same under torchrun and in a plain `python` process.

DeepSpeed needs RANK/WORLD_SIZE/LOCAL_RANK; without them it tries MPI discovery (and fails on a
missing mpi4py). A plain process is treated as a world of one and meets itself through a file
store in a private temporary directory, not a TCP port: a port picked as free and bound a moment
later can be taken in between by any other process on the machine (EADDRINUSE, seen in CI).
On CPU the backend is gloo.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

# DeepSpeed JIT-builds its CPU comm op on first use, under a `lock` file that torch polls for
# forever. A process killed mid-build (kill -9 of the first stage of a fresh venv) leaves the lock
# behind and every later stage hangs at 0% CPU. A build takes about a minute here.
STALE_BUILD_LOCK_S = 300.0


def extensions_root() -> Path:
    """Where torch builds and finds JIT extensions: TORCH_EXTENSIONS_DIR when set, else a folder
    of this virtual environment. The op is built against this venv's torch and headers, so in
    torch's shared default (~/.cache/torch_extensions) two checkouts rebuild each other's op,
    about 25 s each time. Outside a writable venv, torch's default."""
    from torch.utils.cpp_extension import get_default_build_root

    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    if sys.prefix != sys.base_prefix and os.access(sys.prefix, os.W_OK):
        return Path(sys.prefix) / "torch_extensions"
    return Path(get_default_build_root())


def _prepare_op_builds() -> None:
    """Point torch's JIT builds at `extensions_root()`, run by this venv's ninja when it has one
    (both read by torch at each build or load), and clear stale build locks there. Torch runs the
    first `ninja` on PATH, and a system ninja (1.11) and pip's (1.13) hash a build command
    differently in the build log: stages run with the venv's bin first on PATH (`make repro`,
    DVC) and processes without it rebuilt each other's op, about 23 s each time (10 times in one
    run of the test suite)."""
    root = extensions_root()
    os.environ["TORCH_EXTENSIONS_DIR"] = str(root)
    own = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if Path(own, "ninja").is_file() and path.split(os.pathsep)[0] != own:
        os.environ["PATH"] = os.pathsep.join([own, path]) if path else own
    clear_stale_build_locks(root)


def clear_stale_build_locks(root: Path, max_age_s: float = STALE_BUILD_LOCK_S) -> list[Path]:
    """Delete DeepSpeed op build locks older than ``max_age_s`` (returned); warn about newer
    ones, which either belong to a build running now or will make this process wait."""
    removed = []
    for lock in sorted(root.glob("*/deepspeed_*/lock")) + sorted(root.glob("deepspeed_*/lock")):
        age = time.time() - lock.stat().st_mtime
        if age > max_age_s:
            lock.unlink(missing_ok=True)
            removed.append(lock)
            log.warning("removed %s, a build lock left %.0f s ago by a killed process", lock, age)
        else:
            log.warning("%s exists (%.0f s old): waiting for another process's DeepSpeed build; "
                        "if none is running, delete the file", lock, age)
    return removed


RENDEZVOUS_PREFIX = "longturn-dist-"


def _rendezvous_owner() -> str:
    """`<pid>.<host>`: names a rendezvous dir so a later process can tell its owner is dead."""
    return f"{os.getpid()}.{socket.gethostname()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def clear_stale_rendezvous_dirs(root: Path) -> list[Path]:
    """Delete (and return) rendezvous dirs under `root` whose process on this host is gone.

    atexit never runs in a SIGKILLed process, so its dir would stay in the temp dir forever;
    the next plain process sweeps it. Dirs of other hosts (a shared /tmp) and of live
    processes are left alone."""
    host = socket.gethostname()
    removed = []
    for path in sorted(root.glob(f"{RENDEZVOUS_PREFIX}*.*-*")):
        owner = path.name[len(RENDEZVOUS_PREFIX):].rsplit("-", 1)[0]
        pid, _, owner_host = owner.partition(".")
        if owner_host == host and pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _single_process_init_method() -> str:
    """Fill the rank variables a plain process lacks and return a file:// rendezvous of its own."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(key, value)
    clear_stale_rendezvous_dirs(Path(tempfile.gettempdir()))
    store_dir = Path(tempfile.mkdtemp(prefix=f"{RENDEZVOUS_PREFIX}{_rendezvous_owner()}-"))
    # The group lives until the process ends; the rendezvous file must not outlive it.
    atexit.register(shutil.rmtree, store_dir, ignore_errors=True)
    # Unquoted: torch opens the URL's path as is, so a %-escape (of a space in TMPDIR) would
    # name a file in a dir that does not exist, and the rendezvous would wait forever.
    return f"file://{store_dir / 'store'}"


def build_comm_op() -> bool:
    """Build DeepSpeed's CPU comm op now (`make install` does), so the first stage of a fresh
    machine neither pays the build (about 25 s) nor, killed during it, leaves its lock behind.
    False where this accelerator has no such op (a GPU node talks over NCCL)."""
    from deepspeed.comm.torch import build_shm_op

    _prepare_op_builds()
    return build_shm_op() is not None


def init_distributed(device: torch.device | str) -> tuple[int, int]:
    """Initialise torch.distributed and DeepSpeed's comm layer once; return (rank, world_size).

    ``device`` (resolved `engine.device`) decides where DeepSpeed puts its engines and which
    backend the ranks talk over: NCCL between GPUs, gloo between CPU processes."""
    from longturn.device import pin_accelerator

    # a plain process: no launcher (torchrun, deepspeed, a Kubernetes job) set the rendezvous
    single = not dist.is_initialized() and not all(
        key in os.environ for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
    init_method = _single_process_init_method() if single else None
    device = torch.device(device)
    pin_accelerator(device)
    if not dist.is_initialized():
        import deepspeed

        _prepare_op_builds()
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo",
                                   auto_mpi_discovery=False, verbose=False, init_method=init_method,
                                   rank=0 if single else -1, world_size=1 if single else -1)
        # Registered after the rendezvous dir's removal, so it runs before it (atexit is LIFO).
        atexit.register(destroy_distributed)
    return dist.get_rank(), dist.get_world_size()


def destroy_distributed() -> None:
    """End the process group before the interpreter does. Left to interpreter exit, NCCL's
    teardown kept a finished critic warm-up alive for 7 minutes on an H200 (torch 2.11, CUDA 13,
    one rank, "destroy_process_group() was not called before program exit"), until the campaign's
    budget killed it; PyTorch asks every rank to destroy its groups at the end of main()."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_tensor(tensor: torch.Tensor, op: Any = None) -> torch.Tensor:
    """all_reduce of a CPU tensor through the backend's device (NCCL only moves GPU tensors);
    returns a CPU tensor."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return tensor
    nccl = dist.get_backend() == "nccl"
    moved = tensor.to(torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu")
    dist.all_reduce(moved, op=dist.ReduceOp.SUM if op is None else op)
    return moved.cpu()


def is_main_process() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def sum_over_ranks(values: np.ndarray) -> np.ndarray:
    """Element-wise sum of a float array over all ranks (the array itself in a world of one)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    return all_reduce_tensor(torch.as_tensor(np.asarray(values, dtype=np.float64))).numpy()
