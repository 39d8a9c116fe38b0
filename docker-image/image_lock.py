"""The GPU image's locks, resolved for the image's platform rather than this machine's.

`requirements.lock` pins the development environment, where torch is the CPU build. The image
installs the same pins resolved against PyPI for Linux x86_64 / glibc 2.35 (Ubuntu 22.04, the
base image's distribution) / CPython 3.11, where torch 2.13.0 is the CUDA 13.0 build and pulls
its nvidia-* wheels: that is `docker-image/requirements-gpu.lock`. SGLang gets its own venv
and its own lock, `docker-image/sglang.lock`. (The folder's name has a hyphen so that it is never
imported as a package: a `docker/` folder at the root would shadow the `docker` package.)

    python docker-image/image_lock.py     # rewrite both locks (needs PyPI)

The resolution is `pip install --dry-run --report` with `--platform` tags for that glibc and
`--only-binary :all:`, reading wheels' metadata by HTTP range requests (`resolve` says why). A few pins are published only as sdists (pure-Python packages); they are
built to wheels first (as the image build does) and offered through `--find-links`, and the lock
marks them `# sdist`. tests/test_image.py runs the same resolution on the committed locks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_LOCK = ROOT / "docker-image" / "requirements-gpu.lock"
SGLANG_LOCK = ROOT / "docker-image" / "sglang.lock"
SGLANG = "sglang==0.5.23"
GLIBC = (2, 35)          # Ubuntu 22.04
PYTHON = "3.11"
INDEX = "https://pypi.org/simple"
SDIST = "# sdist"
_MISSING = re.compile(r"No matching distribution found for (\S+==\S+)")


class ResolutionError(RuntimeError):
    """pip could not resolve the pins for the image's platform; the message is pip's."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def platform_tags(glibc: tuple[int, int] = GLIBC) -> list[str]:
    """Every manylinux tag a glibc `glibc` x86_64 system installs (pip does not expand
    `manylinux_2_35` to the older ones by itself)."""
    major, minor = glibc
    tags = [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 4, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def pins(lock: Path) -> dict[str, str]:
    """{normalized name: version} of a lock's `name==version` lines."""
    found = {}
    for line in lock.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            found[normalize(name)] = version
    return found


def sdist_pins(lock: Path) -> list[str]:
    """The lock's `name==version` lines marked `# sdist`."""
    return [line.split("#", 1)[0].strip() for line in lock.read_text().splitlines()
            if line.rstrip().endswith(SDIST)]


def _pip_env() -> dict[str, str]:
    """This machine's pip settings minus anything that points pip at local wheels or caps
    versions (config files, find-links, constraints, extra indexes): only PyPI decides."""
    keep = {"PIP_CERT", "PIP_DEFAULT_TIMEOUT"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in keep}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _pip(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args, "--no-cache-dir",
                           "--index-url", INDEX], env=_pip_env(), capture_output=True, text=True,
                          timeout=timeout)


def build_wheels(requirements: list[str], dest: Path) -> None:
    """Build sdist-only pins into pure-Python wheels in `dest`, as the image build does."""
    for requirement in requirements:
        name = requirement.split("==")[0]
        done = _pip("wheel", "--no-deps", "--no-binary", name, "--quiet", "-w", str(dest),
                    requirement)
        if done.returncode != 0:
            raise ResolutionError(f"{requirement} does not build: {done.stderr.strip()[-1500:]}")


def resolve(requirements: list[str], wheels: Path, python: str = PYTHON) -> dict[str, dict]:
    """{normalized name: {"version", "url"}} that pip would install for the image's platform
    (CPython `python`: tests/test_python_versions.py checks every version pyproject admits).

    fast-deps: pip reads each wheel's METADATA by HTTP range requests instead of downloading
    it. PyPI as reached from our machines serves no PEP 658 `.metadata` files, so a plain dry
    run downloads every wheel: 4.1 GB of temp files for the SGLang lock alone, and the six
    resolutions of the test suite, side by side, filled a CI machine's disk. With it: 3 MB."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        tags = [arg for tag in platform_tags() for arg in ("--platform", tag)]
        done = _pip("install", "--dry-run", "--use-feature=fast-deps", "--ignore-installed",
                    "--quiet", "--report", str(report), *tags, "--python-version", python,
                    "--only-binary", ":all:", "--find-links", str(wheels), *requirements)
        if done.returncode != 0:
            raise ResolutionError(done.stderr.strip()[-3000:])
        installs = json.loads(report.read_text())["install"]
    return {normalize(i["metadata"]["name"]): {"version": i["metadata"]["version"],
                                               "url": i["download_info"]["url"]}
            for i in installs}


def resolve_building_sdists(requirements: list[str], wheels: Path) -> dict[str, dict]:
    """`resolve`, building each pin PyPI has only as an sdist when pip names it missing."""
    for _ in range(20):
        try:
            return resolve(requirements, wheels)
        except ResolutionError as err:
            missing = _MISSING.search(str(err))
            if missing is None:
                raise
            build_wheels([missing.group(1)], wheels)
    raise ResolutionError("more than 20 sdist-only pins: resolve by hand")


def write_lock(path: Path, resolved: dict[str, dict], wheels: Path, header: str) -> None:
    lines = [f"# {line}".rstrip() for line in header.strip().splitlines()]
    for name in sorted(resolved):
        entry = resolved[name]
        built = entry["url"].startswith(wheels.as_uri())
        lines.append(f"{name}=={entry['version']}" + (f"  {SDIST}" if built else ""))
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        wheels = Path(tmp)
        gpu = resolve_building_sdists(["-r", str(ROOT / "requirements.lock")], wheels)
        write_lock(GPU_LOCK, gpu, wheels, f"""
The GPU image's /opt/venv: requirements.lock resolved by `python docker-image/image_lock.py`
for Linux x86_64, glibc {GLIBC[0]}.{GLIBC[1]} (Ubuntu 22.04), CPython {PYTHON}, from PyPI, where
torch is the CUDA build (CUDA 13.0: cuda-toolkit, nvidia-*-cu13). Same versions as
requirements.lock plus those wheels. `# sdist`: PyPI has no wheel; pip builds it (pure Python).
Regenerate, do not edit.
""")
        sglang = resolve_building_sdists([SGLANG], wheels)
        write_lock(SGLANG_LOCK, sglang, wheels, f"""
The GPU image's /opt/sglang: {SGLANG} and everything it pulls, resolved by
`python docker-image/image_lock.py` for the same platform. SGLang pins its own torch and
transformers, so it has its own venv and lock. Regenerate, do not edit.
""")
    print(f"wrote {GPU_LOCK.relative_to(ROOT)} ({len(gpu)} pins) and "
          f"{SGLANG_LOCK.relative_to(ROOT)} ({len(sglang)} pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
