"""Checks that refuse params which cannot run, before a stage loads a model or starts a worker.

Why: an unknown env, task or engine used to surface only after the model had loaded and the env
workers had started (42-67 s), and a budget longer than the model's context never did. Each
check reuses the lookup the stage does later (the env, task and engine registries, the
conversation setup), so the lists of names live in one place. Nothing here builds an env,
loads weights or starts a process: plugins are imported and looked up only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from longturn.params.config import Params
from longturn.engines.registry import engine_factory
from longturn.errors import SettingError
from longturn.params.limits import Limit
from longturn.params.sizes import over, row_positions
from longturn.run.protocol import protocol

CONTEXT_KEYS = ("max_position_embeddings", "n_positions")  # Llama/Qwen/LLaVA text; GPT-2


def model_context(model_dir: str | Path) -> tuple[int, str] | None:
    """The positions the model in `model_dir` was built for, from its config.json (top level or
    `text_config` of a vision-language model) and the key it came from; None when the dir has
    no readable config.json (the stage's own model-dir check names that) or it states none."""
    try:
        config: Any = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") if isinstance(config, dict) else None):
        for key in CONTEXT_KEYS:
            value = section.get(key) if isinstance(section, dict) else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, key
    return None


def preflight(params: Params, model_dir: str | Path | None = None) -> None:
    """Every check a stage can make before work: names, then, when the model's context is known,
    that a row (prompt budget + reply, or the sequence budget) fits its positions."""
    engine_factory(params.engine.name)
    protocol(params).check_names(params)
    found = None if model_dir is None else model_context(model_dir)
    if found is not None:
        context, key = found
        problem = over([row_positions(params)], Limit(
            context, f"the positions of the model in {model_dir} (config.json {key})"))
        if problem:
            raise SettingError(problem)
