"""One case on one tree: its params written by the tree's own CLI plus the toy overrides, then
its stages as child processes, each logged to a file next to its outputs."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from parity import ParityError
from parity.cases import Case, apply, overrides, stage_commands
from parity.trees import Tree, run_console_script, tail

ITERATION_0 = Path("train/trajectories/iteration=0000/part-00.parquet")
STAGE_TIMEOUT_S = 1800


@dataclass(frozen=True)
class RunOutputs:
    params: dict
    trajectories: Path
    final: Path


def write_params(tree: Tree, case: Case, run: Path, model_source: str | None,
                 tiny: bool) -> Path:
    """`longturn params PROFILE` in the tree, then the case's overrides applied with yaml."""
    written = run / "profile.yaml"
    run_console_script(tree, ["params", case.profile, "--out", str(written)], run / "params.log")
    params = yaml.safe_load(written.read_text())
    where = f"case {case.letter} ({case.name}), {tree.label} tree"
    apply(params, overrides(case, model_source, tiny), where)
    path = run / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def run_case(tree: Tree, case: Case, run: Path, model_source: str | None,
             tiny: bool) -> RunOutputs:
    """Every stage of `case` in `tree`; a failing stage is an error naming it, with its log's
    last lines."""
    run.mkdir(parents=True, exist_ok=True)
    params = write_params(tree, case, run, model_source, tiny)
    for stage, argv in stage_commands(case, params, run):
        log = run / f"{stage}.log"
        try:
            done = tree.python(argv, log=log, timeout=STAGE_TIMEOUT_S)
        except subprocess.TimeoutExpired as err:
            raise ParityError(f"case {case.letter}, {tree.label}: {stage} ran past "
                              f"{STAGE_TIMEOUT_S} s (log: {log})") from err
        if done.returncode != 0:
            raise ParityError(f"case {case.letter} ({case.name}), {tree.label}: {stage} exited "
                              f"{done.returncode} (log: {log})\n{tail(log)}")
    outputs = RunOutputs(yaml.safe_load(params.read_text()), run / ITERATION_0, run / "train/final")
    for path in (outputs.trajectories, outputs.final):
        if not path.exists():
            raise ParityError(f"case {case.letter}, {tree.label}: train wrote no {path}")
    return outputs
