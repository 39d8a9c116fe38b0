"""Every pip resolution the network tests check, in one session fixture: the two image locks for
the image's platform (tests/test_image.py) and the pinned environment for each CPython that
requires-python admits (tests/test_python_versions.py).

Why: both modules need the GPU lock's sdist-only pins built into wheels first, and the six
resolutions are pip subprocesses that take minutes, mostly waiting on PyPI (both modules: 169 s
alone; torch's metadata alone is 35 s of HTTP range requests, see image_lock.resolve). They
start in the background as the session's first test starts (only when a selected test needs
them), while the suite's single-threaded tests leave a core idle, and the fixture waits for
them. One module after the other they took about 106 s of the suite on 2 cores. They run at the
lowest priority (nice 19), so the test that runs beside them keeps its speed: the agent
profile's toy `dvc exp run` took 144 s beside them at normal priority, 66 s at nice 19 (65 s
alone). The suite's total did not change (29 min 36 s, then 29 min 41 s with 12 more tests).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import tomllib
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMAGE_LOCKS = ["requirements-gpu.lock", "sglang.lock"]
VERSIONS = ["3.11", "3.12", "3.13", "3.14"]  # 3.15: contourpy==1.3.3 has no cp315 wheel
PROJECT_FILES = ["pyproject.toml", "README.md", "longturn", "components", "pipeline"]


def image_lock() -> ModuleType:
    """docker-image/image_lock.py, loaded by path (the folder is not a package)."""
    path = ROOT / "docker-image" / "image_lock.py"
    spec = importlib.util.spec_from_file_location("image_lock", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=15):
            return True
    except OSError:
        return False


def build_project_wheel(dest: Path, scratch: Path) -> None:
    """The project's wheel, built from a copy so the checkout gets no build/ or egg-info."""
    for name in PROJECT_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, scratch / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, scratch / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                           "--no-build-isolation", "-w", str(dest), str(scratch)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"the project does not build: {done.stderr[-2000:]}"


@dataclass(frozen=True)
class Resolution:
    """One resolution: the --find-links dir it was given, and what pip would install (or why
    it could not: raised by the test that reads it)."""

    wheels: Path
    resolved: dict | Exception


def _attempt(work: Callable[[], object]) -> object:
    try:
        return work()
    except Exception as err:  # reported by the test that needs it
        return err


FIXTURE = "lock_resolutions"
_started: dict[str, Any] = {}  # "checked" once the first test ran; "all": the resolutions' Future


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """At the session's first test call (its temp files already under the basetemp), start
    resolving in the background when any selected test asks for the resolutions. A hook, not an
    autouse fixture: tests/tiers.py reads every fixture of a test as evidence of what it does."""
    if "checked" in _started:
        return
    _started["checked"] = True
    if any(FIXTURE in getattr(other, "fixturenames", ()) for other in item.session.items):
        pool = ThreadPoolExecutor(1, thread_name_prefix="lock-resolutions")
        # what the tmp_path_factory fixture returns
        _started["all"] = pool.submit(_in_the_background, item.config._tmp_path_factory)
        pool.shutdown(wait=False)


@pytest.fixture(scope="session")
def lock_resolutions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Resolution]:
    """Keyed by image lock name and by Python version (the tests skip when PyPI cannot be
    reached)."""
    started: Future | None = _started.get("all")
    resolved = started.result() if started is not None else resolve_all(tmp_path_factory)
    if resolved is None:
        pytest.skip("PyPI (https://pypi.org/simple) is unreachable: cannot resolve the locks")
    return resolved


def _in_the_background(tmp_path_factory: pytest.TempPathFactory
                       ) -> dict[str, Resolution] | None:
    """resolve_all at nice 19. On Linux a thread has its own nice value, and the threads and pip
    processes it starts inherit it, so the tests in the foreground keep theirs."""
    if sys.platform.startswith("linux"):  # elsewhere the id could name another process
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    return resolve_all(tmp_path_factory)


def resolve_all(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Resolution] | None:
    """Each distinct sdist-only pin is built once, as the image build does; each lock's dir
    holds the wheels of its own sdist pins, and the Python versions' dir the GPU lock's plus the
    project's wheel; then every resolution side by side."""
    if not pypi_reachable():
        return None
    lock = image_lock()
    locks = {name: ROOT / "docker-image" / name for name in IMAGE_LOCKS}
    needs = {name: lock.sdist_pins(path) for name, path in locks.items()}
    needs["python"] = lock.sdist_pins(lock.GPU_LOCK)
    pins = sorted({pin for wanted in needs.values() for pin in wanted})
    built = {pin: tmp_path_factory.mktemp("sdist") for pin in pins}
    project_dir = tmp_path_factory.mktemp("project_wheel")
    scratch = tmp_path_factory.mktemp("project")
    work = {pin: (lambda pin=pin: lock.build_wheels([pin], built[pin])) for pin in pins}
    work["project"] = lambda: build_project_wheel(project_dir, scratch)
    with ThreadPoolExecutor(len(work)) as pool:
        builds = dict(zip(work, pool.map(_attempt, work.values())))

    def wheels_dir(key: str, pins_needed: list[str], extra: list[Path]) -> Path | Exception:
        for pin in pins_needed:
            if isinstance(builds[pin], Exception):
                return builds[pin]
        dest = tmp_path_factory.mktemp(key.replace(".", "_"))
        for source in [built[pin] for pin in pins_needed] + extra:
            for wheel in source.glob("*.whl"):
                shutil.copy2(wheel, dest)
        return dest

    name, version = lock.normalize(project()["name"]), project()["version"]
    environment = ["-r", str(ROOT / "requirements.lock"), f"{name}=={version}"]
    jobs = {lock_name: (wheels_dir(lock_name, needs[lock_name], []), ["-r", str(path)], None)
            for lock_name, path in locks.items()}
    python_dir = (builds["project"] if isinstance(builds["project"], Exception)
                  else wheels_dir("python", needs["python"], [project_dir]))
    jobs.update({python: (python_dir, environment, python) for python in VERSIONS})

    def resolve(job: tuple[Path | Exception, list[str], str | None]) -> Resolution:
        wheels, requirements, python = job
        if isinstance(wheels, Exception):
            return Resolution(Path(), wheels)
        extra = {} if python is None else {"python": python}
        return Resolution(wheels, _attempt(lambda: lock.resolve(requirements, wheels, **extra)))

    with ThreadPoolExecutor(len(jobs)) as pool:
        return dict(zip(jobs, pool.map(resolve, jobs.values())))
