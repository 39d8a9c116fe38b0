"""One train segment of the Kubeflow pipeline: resume from the previous segment's checkpoint, run
the train stage up to `end_iteration`, and publish only what this segment made.

A segment's inputs are the base model, the warm critic and (after the first) the previous
segment's checkpoint: one `iteration=NNNN/` dir, which carries the metrics history, so the
DVCLive curves of the last segment cover the whole run. Its outputs are that same kind of
checkpoint for the next segment, the trajectories of its own iterations, and (last segment) the
final actor and the metrics. Nothing of earlier segments is copied forward, so N segments move
O(N) bytes, not O(N²).

The stage runs in a work dir: on the volume when `kubeflow.work_dir` is set, named by the
segment's inputs, so a retried pod finds the checkpoints its predecessor wrote and resumes
mid-segment; otherwise a temp dir on the pod's disk. It is removed once the outputs are written.

With `train.push`, the work dir is made a DVC repository carrying the project's remotes
(`longturn/run/dvc_remote.py`), so the train stage uploads each finished iteration to the remote as
it goes, as under DVC; the pointers it writes are published with the trajectories, under
`pushed/`, for a clone to `dvc pull`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from longturn.run.checkpoints import COMPLETE, complete_checkpoints, iteration_dir
from longturn.run.dvc_remote import init_push_repo, pointers
from pipeline.stage_calls import StageFailed, run_stage

WORK_DIR_ENV = "LONGTURN_WORK_DIR"  # set on train tasks from kubeflow.work_dir


@dataclass(frozen=True)
class SegmentOutputs:
    """Where a segment publishes; `actor` and `live` only for the last segment."""

    checkpoint: str
    trajectories: str
    actor: str | None = None
    live: str | None = None


def work_key(params_yaml: str, end_iteration: int, input_uris: list[str]) -> str:
    """The same for a retry of this task (same params, same input artifacts), different for any
    other segment or run input."""
    text = "\n".join([params_yaml, str(end_iteration), *input_uris])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def link_tree(src: Path, dst: Path) -> None:
    """Hard-link every file of `src` under `dst` (copy across filesystems). Stage code never
    rewrites a checkpoint or trajectory file in place, so sharing inodes is safe."""
    shutil.copytree(src, dst, copy_function=_link_or_copy, dirs_exist_ok=True)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def checkpoint_iteration(checkpoints: Path) -> int | None:
    """The iteration of the one complete checkpoint in a checkpoint artifact (None: empty)."""
    done = complete_checkpoints(checkpoints)
    return int(done[-1].name.split("=")[1]) if done else None


def train_segment(params_yaml: str, end_iteration: int, base_model: str, warmup_dir: str,
                  previous: str | None, outputs: SegmentOutputs, work_root: str | None,
                  key: str) -> int:
    """Iterations [previous + 1, end_iteration) into `outputs`; returns the first of them."""
    first = 0
    if previous is not None:
        last = checkpoint_iteration(Path(previous))
        if last is None:
            raise StageFailed(f"the previous segment's checkpoint {previous} has no complete "
                              "iteration=NNNN dir")
        first = last + 1
    work = _work_dir(work_root, key)
    checkpoints = work / "checkpoints"
    if previous is not None and checkpoint_iteration(checkpoints) is None:
        link_tree(Path(previous), checkpoints)  # a fresh work dir; a retry keeps its own
    train = (yaml.safe_load(params_yaml) or {}).get("train", {})
    if train.get("push"):
        init_push_repo(work, project_dir())
    run_stage("train", params_yaml, "--model-dir", base_model,
              "--critic-dir", str(Path(warmup_dir) / "warm"), "--out", str(work),
              launcher=train.get("launcher", "python"),
              overrides={"train.iterations": end_iteration})
    _publish(work, first, end_iteration, outputs)
    if train.get("push"):
        for pointer in pointers(work):
            target = Path(outputs.trajectories) / pointer
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / pointer, target)
    shutil.rmtree(work, ignore_errors=True)
    return first


def project_dir() -> Path:
    """The project checkout whose `.dvc/config` names the remotes: the task's working dir (the
    image's /opt/longturn), else the checkout this package was imported from."""
    for candidate in (Path.cwd(), Path(__file__).resolve().parents[1]):
        if (candidate / ".dvc" / "config").is_file():
            return candidate
    raise StageFailed("train.push is on but no project checkout with a .dvc/config was found "
                      f"(looked in {Path.cwd()} and {Path(__file__).resolve().parents[1]})")


def run_task(params_yaml: str, end_iteration: int, base_model: Any, warmup: Any,
             previous: Any | None, checkpoint: Any, trajectories: Any, actor: Any = None,
             live: Any = None) -> None:
    """A train component's body, given its KFP artifacts. The work dir's root comes from the
    task's environment (kubeflow.work_dir), not an input, so it is no part of the cache key."""
    uris = [base_model.uri, warmup.uri, previous.uri if previous is not None else ""]
    outputs = SegmentOutputs(checkpoint.path, trajectories.path,
                             actor.path if actor is not None else None,
                             live.path if live is not None else None)
    first = train_segment(params_yaml, end_iteration, base_model.path, warmup.path,
                          previous.path if previous is not None else None, outputs,
                          os.environ.get(WORK_DIR_ENV), work_key(params_yaml, end_iteration, uris))
    checkpoint.metadata["iteration"] = end_iteration - 1
    trajectories.metadata["iterations"] = f"{first}..{end_iteration - 1}"


def _work_dir(work_root: str | None, key: str) -> Path:
    if work_root is None:
        return Path(tempfile.mkdtemp(prefix=f"train-{key}-"))
    work = Path(work_root) / f"segment-{key}"
    work.mkdir(parents=True, exist_ok=True)
    return work


def _publish(work: Path, first: int, end: int, outputs: SegmentOutputs) -> None:
    """This segment's trajectories and last checkpoint (plus the final actor and metrics)."""
    last = iteration_dir(work / "checkpoints", end - 1)
    if not (last / COMPLETE).is_file():
        raise StageFailed(f"train wrote no complete checkpoint of iteration {end - 1} in {last}")
    link_tree(last, Path(outputs.checkpoint) / last.name)
    trajectories = Path(outputs.trajectories)
    trajectories.mkdir(parents=True, exist_ok=True)
    for iteration in range(first, end):
        link_tree(iteration_dir(work / "trajectories", iteration),
                  iteration_dir(trajectories, iteration))
    if outputs.actor is not None:
        link_tree(work / "final", Path(outputs.actor))
    if outputs.live is not None:
        link_tree(work / "live", Path(outputs.live))
