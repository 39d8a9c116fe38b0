"""Passes over a shared prompt prefix, kept and reused while the weights they ran through stand.

Every agent prompt starts with the same system prompt and worked example (~500 tokens), and each
packed batch runs that prefix once at batch size 1 (`trunk.py`). Without a memo it still runs once
per batch: four times in a scoring pass, eight times in an update, for the trunk and for every
branch. The trunk's layers are frozen, so its prefix pass is the same for a whole run; a branch's
layers change at each optimizer step, so its pass is reused only inside one no-grad scoring pass.

A pass is reused only for the exact same tokens, the same autocast dtype and unchanged weights
(the sum of the parameters' in-place version counters), so a reused pass is the very tensor a
fresh pass would compute: a resumed run gets the same numbers as one that never stopped.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Iterable

import torch
from torch import nn

CAPACITY = 8  # prefixes kept (one per task prompt and role is the usual load)


def weights_version(modules: Iterable[nn.Module]) -> int:
    """Changes whenever any parameter of the modules is modified in place (optimizer steps,
    `load_state_dict`, `copy_`)."""
    return sum(p._version for m in modules for p in m.parameters())


def autocast_key(device: torch.device) -> str:
    """The dtype a pass computes in under the current autocast state."""
    if torch.is_autocast_enabled(device.type):
        return str(torch.get_autocast_dtype(device.type))
    return "off"


class PrefixMemo:
    """Least-recently-used passes, keyed by (role, prefix tokens, autocast, weights version)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple, Any] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, role: str, prefix_ids: torch.Tensor, modules: Iterable[nn.Module],
            run: Callable[[], Any]) -> Any:
        """The memoised result of `run()` (a no-grad pass over `prefix_ids` through `modules`)."""
        key = (role, tuple(prefix_ids.reshape(-1).tolist()), autocast_key(prefix_ids.device),
               weights_version(modules))
        if key in self._entries:
            self._entries.move_to_end(key)
            self.hits += 1
            return self._entries[key]
        self.misses += 1
        value = run()
        self._entries[key] = value
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        self._entries.clear()
