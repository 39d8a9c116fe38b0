"""Objects named by import path in settings (env factories, tools, interactions, rollout
functions), with one wording for what went wrong."""

from __future__ import annotations

import importlib
from typing import Any

from longturn.errors import SettingError


def import_object(module_name: str, attr: str, where: str) -> Any:
    """`module_name.attr`; a SettingError prefixed with `where` when either is missing."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise SettingError(f"{where}: cannot import module {module_name!r}: {err}") from err
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SettingError(f"{where}: module {module_name!r} has no {attr!r}") from None
