"""Each env family's alias table, kept as data (`synonyms.yaml` next to the family's code)."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml


@lru_cache(maxsize=None)
def load_synonyms(package: str) -> dict[str, str]:
    """`package`'s synonyms.yaml (normalised alias -> canonical action), read once per process."""
    text = resources.files(package).joinpath("synonyms.yaml").read_text(encoding="utf-8")
    return {str(k): str(v) for k, v in (yaml.safe_load(text) or {}).items()}
