"""A tool plug-in that breaks the tool contract in every way the arguments ask for
(`rollout.chat.tools` names `hostile_tools:HostileTool`), and the Hermes reply that calls it.

A real plug-in can have any of these bugs; the rollout must turn each into a tool message the
model sees, never end the run. `how` picks the fault; the schema lets every value through, so the
fault reaches `execute`.
"""

from __future__ import annotations

import json
from typing import Any

from longturn.tasks.tools import BaseTool

FLOOD_CHARS = 200_000

# how -> what execute does
FAULTS = {
    "raise": "raises RuntimeError",
    "flood": f"returns {FLOOD_CHARS:,} characters",
    "not_text": "returns a dict where the text goes",
    "not_a_triple": "returns a bare string instead of (text, reward, metrics)",
    "word_reward": "returns a reward that is not a number",
    "nan_reward": "returns a NaN reward",
    "list_metrics": "returns metrics that are not a mapping",
}

SCHEMA = {"type": "function", "function": {
    "name": "hostile", "description": "Misbehaves as asked.",
    "parameters": {"type": "object", "properties": {"how": {"type": "string"}},
                   "required": ["how"]}}}


class HostileTool(BaseTool):
    """Each call fails the way `how` names (see FAULTS); the episode reward raises."""

    def execute(self, instance_id: str, parameters: dict[str, Any]) -> Any:
        how = parameters["how"]
        if how == "raise":
            raise RuntimeError("the hostile tool broke on purpose")
        if how == "flood":
            return "x" * FLOOD_CHARS, 0.0, {}
        if how == "not_text":
            return {"answer": [1, 2]}, 0.0, {}
        if how == "not_a_triple":
            return "just text"
        if how == "word_reward":
            return "fine", "a lot", {}
        if how == "nan_reward":
            return "fine", float("nan"), {}
        if how == "list_metrics":
            return "fine", 0.0, ["not", "a", "mapping"]
        raise AssertionError(f"unknown fault {how!r}")

    def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        raise RuntimeError("the episode reward broke on purpose")


def tools_yaml() -> str:
    """A tools file listing the hostile tool."""
    return json.dumps({"tools": [{"class": f"{__name__}:HostileTool", "schema": SCHEMA}]})


def calling_reply() -> str:
    """One reply that calls the tool once per fault, in FAULTS order."""
    return "\n".join('<tool_call>\n{"name": "hostile", "arguments": {"how": "%s"}}\n</tool_call>'
                     % how for how in FAULTS)
