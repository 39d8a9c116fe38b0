"""Tool calls outside a rollout: the rollout awaits `ToolBox.run` itself; tests run the calls of a
list all at once on the plug-in loop, as a rollout's batch does."""

from __future__ import annotations

from longturn.tasks.plugin_loop import run_together
from longturn.tasks.tool_calls import BadToolCall, ToolCall
from longturn.tasks.tools import ToolBox, ToolResult


def run_calls(box: ToolBox, calls: list[tuple[str, ToolCall | BadToolCall]],
              timeout_s: float | None = None) -> list[ToolResult]:
    """Every (episode, call) at once; the results in the same order."""
    return run_together([lambda e=episode, c=call: box.run(e, c, timeout_s)
                         for episode, call in calls])


def run_call(box: ToolBox, episode: str, call: ToolCall | BadToolCall,
             timeout_s: float | None = None) -> ToolResult:
    return run_calls(box, [(episode, call)], timeout_s)[0]
