"""Atomic writes and named disk errors: a crash or a full disk leaves no half file or half dir.

Files and dirs are written under a temp name in the same directory and renamed into place, so a
kill (even SIGKILL) leaves either the old complete output or none, never one that looks finished.
A write that fails because the disk is full, read-only or not ours becomes `OutputNotWritable`
naming the path (stage scripts print it as one line); the temp name is removed, and everything
written before it is kept.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from longturn.errors import OutputNotWritable

# errno -> (what is wrong, what to do)
DISK_ERRNOS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on device", "free space or write elsewhere, then rerun"),
    errno.EDQUOT: ("disk quota exceeded", "free space or write elsewhere, then rerun"),
    errno.EROFS: ("read-only file system", "write to a writable place, then rerun"),
    errno.EACCES: ("permission denied", "make it accessible to this user or use another path"),
}
KEPT = "outputs already written are kept"
MIN_FREE_BYTES = 1 << 20  # below this, a failed write is taken for a full disk


def disk_error(path: str | Path, err: BaseException) -> OutputNotWritable | None:
    """`err` (raised writing `path`) as a named disk error, or None when it is something else.

    OSErrors carry an errno; torch and safetensors raise RuntimeErrors that do not, so for those
    the file system itself is asked whether it is read-only or full."""
    code = err.errno if isinstance(err, OSError) and err.errno else _file_system_state(Path(path))
    if code not in DISK_ERRNOS:
        return None
    where = getattr(err, "filename", None) or path
    what, todo = DISK_ERRNOS[code]
    return OutputNotWritable(f"{where}: {what}; {todo} ({KEPT})")


def _file_system_state(path: Path) -> int | None:
    """EROFS or ENOSPC when the file system holding `path` is read-only or full, else None."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        stat = os.statvfs(probe)
    except OSError:
        return None
    if stat.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if stat.f_bavail * stat.f_frsize < MIN_FREE_BYTES:
        return errno.ENOSPC
    return None


@contextmanager
def named_disk_errors(path: str | Path) -> Iterator[None]:
    """Re-raise a disk failure inside the block as OutputNotWritable naming `path`."""
    try:
        yield
    except OutputNotWritable:
        raise
    except Exception as err:
        named = disk_error(path, err)
        if named is None:
            raise
        raise named from err


def temp_name(path: Path) -> Path:
    """The temp sibling `path` is written under before its rename (hidden, per process)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temp path to write; on success it replaces `path`, on failure it is removed."""
    path = Path(path)
    tmp = temp_name(path)
    with named_disk_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            yield tmp
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temp dir to fill; on success it replaces the dir `path` whole.

    On failure the temp dir is removed and `path` is left as it was. Temp dirs of killed
    earlier attempts are removed first."""
    path = Path(path)
    tmp = temp_name(path)
    with named_disk_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        for pattern in (f".{path.name}.tmp-*", f".{path.name}.old-*"):
            for stale in path.parent.glob(pattern):
                shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
        try:
            yield tmp
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            if path.exists():
                path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def fsync_file(path: str | Path) -> None:
    """Flush a file (or a dir, after a rename into it) to the disk: a journal entry that was
    renamed into place survives a power cut, not only a kill."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: str | Path, text: str) -> Path:
    with atomic_file(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path: str | Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
