"""The learning run: the stages of dvc.yaml, in its order, as plain commands (the GPU node has no
DVC), each writing under the campaign's work dir instead of the checkout's data/.

Commands are read from dvc.yaml itself, so the campaign runs exactly what `dvc repro` runs: the
`${train.launcher}` template becomes the profile's launcher, `python` this interpreter,
`params.yaml` the campaign's merged params and every `data/...` path the same path under the
work dir. Stages run from the repository root (tools and interaction YAMLs are named relative to
it) and write each a log of their own.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Stage:
    name: str
    argv: list[str]

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def _template(cmd: str, launcher: str) -> str:
    if "${" in cmd.replace("${train.launcher}", ""):
        raise ValueError(f"dvc.yaml command uses a template the campaign cannot fill: {cmd}")
    return cmd.replace("${train.launcher}", launcher)


def _rewrite(token: str, work: Path, params: Path) -> str:
    if token == "python":
        return sys.executable
    if token == "params.yaml":
        return str(params)
    if token.startswith("data/"):
        return str(work / token)
    return token


def learning_stages(work: Path, params: Path, launcher: str = "python") -> list[Stage]:
    """Every stage of dvc.yaml, in file order, as argv lists writing under `work`."""
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    stages = []
    for name, stage in spec.items():
        argv = shlex.split(_template(stage["cmd"], launcher))
        stages.append(Stage(name, [_rewrite(t, work, params) for t in argv]))
    return stages


def run_stage(stage: Stage, log: Path, extra: list[str] | None = None,
              timeout_s: float | None = None) -> tuple[int, float]:
    """Run one stage from the repository root with the checkout importable; (exit code,
    seconds). The log gets the command line first, then everything the stage prints."""
    argv = stage.argv + (extra or [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p), PYTHONUNBUFFERED="1")
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with log.open("w") as handle:
        handle.write("$ " + shlex.join(argv) + "\n")
        handle.flush()
        try:
            code = subprocess.run(argv, cwd=ROOT, env=env, stdout=handle,
                                  stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            handle.write(f"\n[campaign] stopped: the budget ran out after {timeout_s:.0f} s\n")
            code = 124
    return code, time.time() - start


def log_tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.is_file() else ""
