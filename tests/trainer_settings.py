"""TrainerSettings for tests, built the way the stages build them: from the pydantic params'
defaults (the one source of defaults), pinned to the small CPU baseline the unit tests are written
for (fp32, full fine-tuning, no shared prefix), then each test's own overrides."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from longturn.params.config import Params
from longturn.run.wiring import trainer_settings

BASELINE = {"bf16": False, "lora": False, "share_prefix": False}


def make_settings(**overrides: Any) -> Any:
    """Params() → TrainerSettings, the baseline, then `overrides`."""
    return replace(trainer_settings(Params()), **{**BASELINE, **overrides})
