"""Push the train stage's finished iterations and kept checkpoints to a DVC remote mid-run
(docs/dvc-remote.md).

Why not `dvc commit` + `dvc push` of the stage's outputs: while `dvc repro` runs the train stage it
holds a write lock on `data/train/trajectories` and `data/train/checkpoints`, and their hashes only
reach dvc.lock when the stage ends. So each immutable piece (one `iteration=NNNN` trajectory dir,
one committed checkpoint dir) is sent with `dvc add --to-remote SRC -o pushed/<SRC path>`: DVC
uploads it straight to the remote (no cache copy) and writes a small pointer outside the stage's
outputs. The pointers mirror the run: one whose source is gone (a pruned checkpoint, a run started
over) is removed. Files are content-addressed on the remote, so the final `dvc push` after the
stage re-sends none of them.

A failed push never stops training: it is logged as a warning naming the remote and the command.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from longturn.run.checkpoints import complete_checkpoints

log = logging.getLogger(__name__)

POINTER_ROOT = "pushed"  # pointers live under <repo>/pushed/<path of the pushed dir in the repo>
URL_REMOTE = "longturn-url"  # the local-config remote a URL in `train.remote` becomes
_warned_outside: set[Path] = set()
_configured: set[tuple[Path, str]] = set()  # (repo, url) already added as URL_REMOTE


def find_repo_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` that holds `.dvc/`, or None."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / ".dvc").is_dir():
            return folder
    return None


def dvc_executable() -> Path:
    """The `dvc` installed next to the running interpreter (the project's venv)."""
    return Path(sys.executable).parent / "dvc"


def pointer_for(repo: Path, source: Path) -> Path:
    """Where the `.dvc` pointer of `source` goes (without the suffix: DVC appends `.dvc`)."""
    return repo / POINTER_ROOT / source.resolve().relative_to(repo)


def iteration_dirs(root: Path, upto: int) -> list[Path]:
    """`iteration=NNNN` dirs under `root` (no `.tmp`), up to iteration `upto` inclusive."""
    out = []
    for d in sorted(root.glob("iteration=*")):
        number = d.name.split("=", 1)[1]
        if d.is_dir() and number.isdigit() and int(number) <= upto:
            out.append(d)
    return out


def _up_to_date(source: Path, pointer: Path) -> bool:
    """The pointer was written after the newest file of `source`."""
    dvc_file = pointer.with_name(pointer.name + ".dvc")
    if not dvc_file.is_file():
        return False
    times = [p.stat().st_mtime for p in source.rglob("*") if p.is_file()]
    return dvc_file.stat().st_mtime >= max(times, default=source.stat().st_mtime)


def _remote_label(repo: Path, remote: str | None) -> str:
    if remote:
        return f"'{remote}'"
    out = _run_dvc(repo, ["config", "core.remote"])
    name = out.stdout.strip() if out.returncode == 0 else ""
    return f"the default remote '{name}'" if name else "the default remote (none is set)"


def _run_dvc(repo: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    try:
        return subprocess.run([str(dvc_executable()), *args], cwd=repo, capture_output=True,
                              text=True, env=env)
    except OSError as err:  # no dvc next to this Python
        return subprocess.CompletedProcess(args, 127, "", str(err))


def resolve_remote(repo: Path, remote: str | None) -> str | None:
    """The remote name to push to: `remote` itself, or `longturn-url` set to it if it is a URL
    (in `.dvc/config.local`, never the committed config). None: the default remote."""
    if remote is None or not ("://" in remote or remote.startswith(("/", "~", "."))):
        return remote  # a remote's name, not a URL or a path
    url = str(Path(remote).expanduser().resolve()) if "://" not in remote else remote
    if (repo, url) in _configured:
        return URL_REMOTE
    _run_dvc_or_raise(repo, ["remote", "add", "--local", "--force", URL_REMOTE, url])
    _configured.add((repo, url))
    return URL_REMOTE


def init_push_repo(folder: Path, project: Path) -> Path:
    """Make `folder` a DVC repository without git (`dvc init --no-scm`) that has the remotes of
    the project at `project` (its `.dvc/config`), unless it is inside one already. For a run
    dir outside any checkout, e.g. a Kubeflow task's scratch dir. Returns the repository."""
    existing = find_repo_root(folder)
    if existing is not None:
        return existing
    folder.mkdir(parents=True, exist_ok=True)
    _run_dvc_or_raise(folder, ["init", "--no-scm", "--quiet"])
    config = project / ".dvc" / "config"
    if config.is_file():  # the project's remotes; `no_scm` (set by init) set again over it
        shutil.copyfile(config, folder / ".dvc" / "config")
        _run_dvc_or_raise(folder, ["config", "core.no_scm", "true"])
    return folder


def pointers(repo: Path) -> list[Path]:
    """Every pointer written under `<repo>/pushed/`, relative to the repository."""
    return sorted(p.relative_to(repo) for p in (repo / POINTER_ROOT).rglob("*.dvc"))


def _run_dvc_or_raise(repo: Path, args: list[str]) -> None:
    result = _run_dvc(repo, args)
    if result.returncode != 0:
        raise RuntimeError(f"`dvc {' '.join(args)}` in {repo} failed: "
                           f"{' '.join((result.stderr + result.stdout).split())}")


def push_dir(repo: Path, source: Path, remote: str | None) -> bool:
    """Upload one directory straight to the remote and (re)write its pointer; False on failure."""
    pointer = pointer_for(repo, source)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_dir():  # a pulled copy: `-o` onto an existing dir would nest the new one inside
        shutil.rmtree(pointer)
    args = ["add", "--quiet", "--force", "--to-remote", *(["--remote", remote] if remote else []),
            str(source.resolve().relative_to(repo)), "--out", str(pointer.relative_to(repo))]
    result = _run_dvc(repo, args)
    if result.returncode == 0:
        return True
    detail = " ".join((result.stderr + result.stdout).split())
    log.warning("push to %s failed (training goes on): `%s %s` in %s: %s",
                _remote_label(repo, remote), dvc_executable(), " ".join(args), repo,
                detail or "no output")
    return False


def _prune_pointers(repo: Path, root: Path) -> None:
    """Pointers (and pulled copies) of iteration dirs that no longer exist under `root`."""
    mirror = pointer_for(repo, root)
    for dvc_file in mirror.glob("iteration=*.dvc"):
        name = dvc_file.name.removesuffix(".dvc")
        if not (root / name).is_dir():
            dvc_file.unlink()
            shutil.rmtree(mirror / name, ignore_errors=True)


def push_training_outputs(trajectories: Path, checkpoints: Path, iteration: int,
                          remote: str | None) -> list[Path]:
    """Push every finished iteration's trajectories (up to `iteration`) and every kept checkpoint
    not pushed yet (a failed one is retried at the next call); returns the dirs pushed. Outside
    a DVC repository: one warning per run dir. Never raises: a run must outlive its remote."""
    try:
        return _push(trajectories, checkpoints, iteration, remote)
    except Exception as err:  # noqa: BLE001  (a disk or DVC surprise here must not end training)
        log.warning("push to the DVC remote skipped (training goes on): %s: %s",
                    type(err).__name__, err)
        return []


def _push(trajectories: Path, checkpoints: Path, iteration: int,
          remote: str | None) -> list[Path]:
    repo = find_repo_root(trajectories)
    if repo is None:
        key = trajectories.resolve()
        if key not in _warned_outside:
            _warned_outside.add(key)
            log.warning("train.push is on but %s is not inside a DVC repository (no .dvc/ above "
                        "it): nothing is pushed", trajectories)
        return []
    remote = resolve_remote(repo, remote)
    kept = complete_checkpoints(checkpoints)
    sources = [d for d in (*iteration_dirs(trajectories, iteration), *kept)
               if d.resolve().is_relative_to(repo)]
    started, pushed = time.monotonic(), []
    for source in sources:
        if not _up_to_date(source, pointer_for(repo, source)) and push_dir(repo, source, remote):
            pushed.append(source)
    for root in (trajectories, checkpoints):
        if root.resolve().is_relative_to(repo):
            _prune_pointers(repo, root)
    if pushed:
        log.info("pushed %d dirs to the DVC remote in %.1f s (pointers under %s)", len(pushed),
                 time.monotonic() - started, repo / POINTER_ROOT)
    return pushed
