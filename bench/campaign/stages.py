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
import re
import shlex
import signal
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


# A stage that prints nothing for this long is taken for hung and killed: on the first H200
# campaign a finished critic warm-up sat in NCCL's teardown, silent at 0% GPU, for 433 s of a
# 15-minute lease. Every stage prints progress bars or log lines far more often (a model load,
# the longest silence, takes under a minute).
STALL_S = 180.0
# The last line every stage prints (components/common.py `run`) before the interpreter's teardown:
# a stage stopped as hung after printing it has written its outputs.
FINISHED = re.compile(r"^\w+: finished in \d+ s$", re.MULTILINE)
STALLED = 125  # the exit code run_stage gives a stage it killed as hung
BUDGET_SPENT = 124  # ... and one it killed at the budget


def run_stage(stage: Stage, log: Path, extra: list[str] | None = None,
              timeout_s: float | None = None,
              stall_s: float | None = STALL_S) -> tuple[int, float]:
    """Run one stage from the repository root with the checkout importable; (exit code,
    seconds). The log gets the command line first, then everything the stage prints. A stage
    still running at `timeout_s`, or silent for `stall_s` (None: a bench that prints only at its
    end), is stopped with everything it started (its own session): exit BUDGET_SPENT or STALLED,
    and the log says which."""
    argv = stage.argv + (extra or [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p), PYTHONUNBUFFERED="1")
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with log.open("w") as handle:
        handle.write("$ " + shlex.join(argv) + "\n")
        handle.flush()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)
        size, quiet_since = -1, time.time()
        while proc.poll() is None:
            now = time.time()
            if log.stat().st_size != size:
                size, quiet_since = log.stat().st_size, now
            why = None
            if timeout_s is not None and now - start > timeout_s:
                why, code = f"the budget ran out after {timeout_s:.0f} s", BUDGET_SPENT
            elif stall_s is not None and now - quiet_since > stall_s:
                why, code = (f"no output for {stall_s:.0f} s: taken for hung (it ran "
                             f"{now - start:.0f} s)"), STALLED
            if why is not None:
                _stop(proc)
                handle.write(f"\n[campaign] stopped: {why}\n")
                return code, time.time() - start
            time.sleep(0.5)
    return proc.returncode, time.time() - start


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the stage's whole session (its env workers too), SIGKILL after 10 s."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue


def log_tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.is_file() else ""
