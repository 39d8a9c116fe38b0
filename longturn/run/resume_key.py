"""What a persisted training run was trained from, so that a rerun resumes only its own
checkpoints (`data/train/checkpoints` outlives a stage under DVC: `persist: true`).

Resuming is right after a kill, or when `train.*` asks for more iterations; it is wrong when the
run would mix in another start (docs/operations.md, "Kill and resume"). Each part of the key is
named, so a mismatch says what changed. Code is not a part: a checkpoint resumes across an upgrade.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from longturn.params.config import Params
from longturn.run.eval_key import named_files

HASHED_UP_TO = 64 * 2**20  # files this small (configs, tokenizer, a value head) by content


def params_digest(params: Params) -> str:
    """The sections a resumed run must share with the one that wrote the checkpoints (train.*
    may change: more iterations continue the run)."""
    relevant = params.model_dump(include={"seed", "model", "env", "prompt", "engine", "rollout",
                                          "gae", "algo", "ppo"})
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def model_identity(model_dir: Path) -> str:
    """Each file of a model dir by relative path and size, and by content up to HASHED_UP_TO:
    a new warm-up changes its small value head. Neither the files' times nor the big weight
    files' bytes are read, so a copy pulled elsewhere (DVC, a Kubeflow artifact) is the same
    model, and the key costs no read of gigabytes."""
    h = hashlib.sha256()
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        size = path.stat().st_size
        h.update(f"{path.relative_to(model_dir).as_posix()}\0{size}\0".encode())
        if size <= HASHED_UP_TO:
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


def resume_key(params: Params, base: Path, critic: Path | None) -> dict[str, str]:
    """The named parts a checkpoint is kept under."""
    chat = params.rollout.chat
    return {"params": params_digest(params), "base model": model_identity(base),
            "critic": "none" if critic is None else model_identity(critic),
            "tools and interactions files": json.dumps(named_files(chat.tools,
                                                                   chat.interactions),
                                                       sort_keys=True)}


def read_key(text: str) -> dict[str, Any]:
    """A stamp as written: the key's JSON, or (written before the key had parts) the params
    digest alone, which is then all that is compared."""
    try:
        key = json.loads(text)
    except json.JSONDecodeError:
        key = None
    return key if isinstance(key, dict) else {"params": text.strip()}


def changed_parts(stamp: dict[str, Any], key: dict[str, str]) -> list[str]:
    """The parts of `key` the stamp holds with another value."""
    return [name for name, value in stamp.items() if key.get(name) != value]
