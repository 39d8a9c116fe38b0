"""What each Kubeflow task does inside its container: run the same stage script as DVC does.

Kubeflow components (pipeline/components.py) are thin: they hand their artifact folders to these
functions, which write the params the pipeline was compiled with to a file and run
`python -m components.<stage>` (the train stage under `train.launcher`, e.g. torchrun), so a task
fails exactly when the DVC stage would, with the stage's own one-line error in the pod log.
Train segments add their resume-and-publish steps on top (pipeline/segments.py).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from longturn.params.config import parse_params


class StageFailed(RuntimeError):
    """A stage script exited non-zero; its own message is in the task's log above."""


def _params_file(params_yaml: str, overrides: dict | None = None) -> str:
    """The compiled-in params as a file, validated, with `section.key` overrides applied."""
    data = yaml.safe_load(params_yaml) or {}
    for dotted, value in (overrides or {}).items():
        section, key = dotted.split(".")
        data.setdefault(section, {})[key] = value
    parse_params(data, "pipeline params")
    fd, path = tempfile.mkstemp(prefix="params-", suffix=".yaml")
    with open(fd, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    return path


def _launcher(launcher: str) -> list[str]:
    """`train.launcher` as argv; a bare `python` means this interpreter (the image's venv)."""
    argv = shlex.split(launcher)
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def run_stage(stage: str, params_yaml: str, *args: str, launcher: str = "python",
              overrides: dict | None = None) -> None:
    """`launcher -m components.<stage> --params FILE args...`; raises StageFailed on failure."""
    params = _params_file(params_yaml, overrides)
    cmd = [*_launcher(launcher), "-m", f"components.{stage}", "--params", params, *args]
    try:
        code = subprocess.run(cmd).returncode
    finally:
        Path(params).unlink(missing_ok=True)
    if code != 0:
        raise StageFailed(f"stage {stage} exited with code {code}: {shlex.join(cmd)}")


def warmup(params_yaml: str, base_model: str, out: str) -> None:
    """critic_warmup into one artifact folder: warm/, live/, batches/, metrics.json."""
    root = Path(out)
    run_stage("critic_warmup", params_yaml, "--model-dir", base_model, "--out", str(root / "warm"),
              "--live", str(root / "live"), "--work", str(root / "batches"),
              "--metrics", str(root / "metrics.json"))


def success_rate(eval_dir: str) -> float:
    """Overall success of an evaluation folder (for the task's Kubeflow metrics)."""
    return float(json.loads((Path(eval_dir) / "metrics.json").read_text())["overall"]["success_rate"])
