"""What an evaluation's episodes were played with, so a resumed evaluation never mixes in episodes
of other settings, other weights or other code (its journal: `longturn/run/eval_journal.py`).

The key is a few digests, each named, so a journal that does not match says what changed: the
params the evaluation stages depend on in dvc.yaml (with the tools and interactions files they
name) and the row labels; the weights (by file size and time: cheap on any size of model, and a
model written again counts as other weights); the code; and the module rollout.agent or
rollout.slime_generate names, by content (its import string stays the same while its code changes).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
from pathlib import Path
from typing import Any

from longturn.params.config import Params

JOURNAL_VERSION = "1"  # raised when the journal's layout changes
PACKAGE = Path(__file__).resolve().parents[1]  # the whole longturn package, not run/ alone


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def params_digest(params: Params, policy_version: str, run_id: str) -> str:
    """The evaluation's own params (what DVC reruns the stage for) and its row labels."""
    p = params.model_dump(mode="json")
    r = p["rollout"]
    return _digest({"model.dtype": p["model"]["dtype"], "env": p["env"], "prompt": p["prompt"],
                    "engine": p["engine"], "eval": p["eval"], "rollout.protocol": r["protocol"],
                    "rollout.context": r["context"], "rollout.chat": r["chat"],
                    "rollout.agent": [r["agent"], r["agent_timeout_s"], r["slime_generate"]],
                    "chat files": named_files(params.rollout.chat.tools,
                                              params.rollout.chat.interactions),
                    "policy_version": policy_version, "run_id": run_id})


def named_files(*paths: str | None) -> dict[str, str]:
    """The content digest of each file a setting names (tools and interactions YAML)."""
    return {p: hashlib.sha256(Path(p).read_bytes()).hexdigest()
            for p in paths if p is not None and Path(p).is_file()}


def weights_digest(model_dir: str | Path) -> str:
    """Each file under the model dir: relative path, size and mtime (links followed)."""
    root = Path(model_dir)
    entries = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        stat = path.stat()
        entries.append([path.relative_to(root).as_posix(), stat.st_size, stat.st_mtime_ns])
    return _digest(entries)


def code_digest(package: Path = PACKAGE) -> str:
    """Every file of the package by relative path and content (bytecode caches left out)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(package):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            path = Path(dirpath) / name
            h.update(path.relative_to(package).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def agent_code_digest(params: Params) -> str:
    """The source file of each module rollout.agent and rollout.slime_generate name (imported as
    the run imports it), by content; a module without a file (built in) by its name."""
    files = {}
    for name in filter(None, (params.rollout.agent, params.rollout.slime_generate)):
        module = importlib.import_module(name.partition(":")[0])
        try:
            path = inspect.getsourcefile(module)
        except TypeError:  # a built-in module
            path = None
        files[name] = hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else name
    return _digest(files)


def evaluation_key(params: Params, policy_version: str, run_id: str,
                   model_dir: str | Path | None) -> dict[str, str]:
    """The key a journal is kept under; `model_dir` None: weights not known (an engine passed in
    by a caller), every journal's weights are taken as the same."""
    return {"journal": JOURNAL_VERSION,
            "params": params_digest(params, policy_version, run_id),
            "weights": "unknown" if model_dir is None else weights_digest(model_dir),
            "code": code_digest(), "agent code": agent_code_digest(params)}
