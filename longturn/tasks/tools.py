"""Tools the model calls during an episode, declared in YAML, one instance per episode.

    tools:
      - class: longturn.tasks.calculator:CalculatorTool   # a BaseTool subclass
        config: {max_length: 200}                         # passed to its constructor
        schema:                                           # OpenAI function schema, given to the
          type: function                                  # chat template's `tools=`
          function: {name: calculator, description: …, parameters: {…JSON Schema…}}

The protocol is verl's: `create` when an episode starts, `execute` per call (result text, a step
reward, metrics), `calc_reward` at the end, `release` after. `ToolBox` dispatches parsed calls
and turns every mistake of the model (unknown tool, bad JSON, arguments that break the schema),
every exception a tool raises and every return value that breaks the protocol (text not a str,
a reward that is not a finite number) into an error message as the tool's result.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from longturn.errors import SettingError
from longturn.tasks.plugins import import_class, read_entries
from longturn.tasks.tool_calls import BadToolCall, ToolCall

log = logging.getLogger(__name__)


class BaseTool:
    """A tool; subclasses implement `execute` and may keep per-episode state in
    `self.instances[instance_id]` (what `create` was given)."""

    def __init__(self, config: dict[str, Any], schema: dict[str, Any]):
        self.config = dict(config)
        self.schema = schema
        self.name: str = schema["function"]["name"]
        self.instances: dict[str, dict[str, Any]] = {}

    def create(self, instance_id: str, **kwargs: Any) -> None:
        """Start this tool's state for one episode (kwargs: the task's `tools_kwargs[name]`)."""
        self.instances[instance_id] = dict(kwargs)

    def execute(self, instance_id: str, parameters: dict[str, Any]
                ) -> tuple[str, float, dict[str, Any]]:
        """Run one call: (result text for the model, step reward, metrics)."""
        raise NotImplementedError

    def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The tool's reward for the whole episode (0 unless a tool says otherwise)."""
        return 0.0

    def release(self, instance_id: str) -> None:
        self.instances.pop(instance_id, None)


@dataclass
class ToolResult:
    """What one call gave: the text the model sees, its step reward, metrics, and the error when
    the call could not run."""

    name: str
    text: str
    reward: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _check_schema(schema: Any, where: str) -> dict[str, Any]:
    function = schema.get("function") if isinstance(schema, dict) else None
    if (not isinstance(function, dict) or schema.get("type") != "function"
            or not isinstance(function.get("name"), str)):
        raise SettingError(f"{where}: 'schema' must be an OpenAI function schema "
                           "{type: function, function: {name, description, parameters}}")
    parameters = function.setdefault("parameters", {"type": "object", "properties": {}})
    try:
        jsonschema.Draft202012Validator.check_schema(parameters)
    except jsonschema.SchemaError as err:
        raise SettingError(f"{where}: function.parameters is not a JSON Schema: "
                           f"{err.message}") from err
    return schema


def load_tools(path: str | Path) -> list[BaseTool]:
    """Every tool listed in a tools YAML file, built."""
    tools: list[BaseTool] = []
    for i, entry in enumerate(read_entries(path, "tools")):
        where = f"{path} tools[{i}]"
        schema = _check_schema(entry.get("schema"), where)
        cls = import_class(entry.get("class"), where)
        if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
            raise SettingError(f"{where}: {entry['class']!r} is not a longturn BaseTool subclass")
        tools.append(cls(entry.get("config") or {}, schema))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise SettingError(f"{path}: tool names repeat: {names}")
    return tools


def _not_a_reward(value: Any) -> bool:
    """Whether a tool's reward would break training: not a number, or NaN or infinite."""
    if isinstance(value, (str, bytes)):
        return True
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


def _broken_result(returned: Any) -> str | None:
    """What is wrong with `execute`'s return value, or None when it keeps the protocol: (text,
    finite reward, metrics mapping or None). A dict's repr is no tool result, a NaN reward
    would reach every advantage of the batch."""
    if not (isinstance(returned, (tuple, list)) and len(returned) == 3):
        return f"a {type(returned).__name__}, not (text, reward, metrics)"
    text, reward, metrics = returned
    if not isinstance(text, str):
        return f"a {type(text).__name__} as its text, not a str"
    if _not_a_reward(reward):
        return f"the reward {reward!r}, not a finite number"
    if metrics is not None and not isinstance(metrics, Mapping):
        return f"metrics of type {type(metrics).__name__}, not a mapping"
    return None


class ToolBox:
    """The tools of a run, dispatching one episode's calls by name."""

    def __init__(self, tools: list[BaseTool]):
        self.tools = {t.name: t for t in tools}
        self._validators = {t.name: jsonschema.Draft202012Validator(
            t.schema["function"]["parameters"]) for t in tools}

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    def create(self, instance_id: str, tools_kwargs: dict[str, dict[str, Any]] | None = None
               ) -> None:
        for name, tool in self.tools.items():
            tool.create(instance_id, **(tools_kwargs or {}).get(name, {}))

    def call(self, instance_id: str, call: ToolCall | BadToolCall) -> ToolResult:
        """Run one parsed call; never raises for anything the model wrote."""
        if isinstance(call, BadToolCall):
            return ToolResult("", f"Error: {call.error}", error="bad_call")
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult(call.name, f"Error: there is no tool named {call.name!r}; the "
                              f"tools are: {', '.join(self.tools) or 'none'}", error="unknown_tool")
        problems = sorted(self._validators[call.name].iter_errors(call.arguments),
                          key=lambda e: list(e.path))
        if problems:
            where = "/".join(str(p) for p in problems[0].path) or "arguments"
            return ToolResult(call.name, f"Error: bad arguments for {call.name}: {where}: "
                              f"{problems[0].message}", error="bad_arguments")
        try:
            returned = tool.execute(instance_id, call.arguments)
        except Exception as err:  # a tool's own bug must not end the run; it is logged in full
            log.warning("tool %s raised on %r", call.name, call.arguments, exc_info=True)
            return ToolResult(call.name, f"Error: {call.name} failed: {type(err).__name__}: "
                              f"{err}", error="tool_exception")
        problem = _broken_result(returned)
        if problem is not None:
            log.warning("tool %s broke its contract on %r: it returned %s", call.name,
                        call.arguments, problem)
            return ToolResult(call.name, f"Error: {call.name} returned {problem}",
                              error="bad_result")
        text, reward, metrics = returned
        return ToolResult(call.name, text, float(reward), dict(metrics or {}))

    def rewards(self, instance_id: str, **kwargs: Any) -> dict[str, float]:
        """Each tool's episode reward; one that raises or is not a finite number counts 0 (and
        is logged), so a plug-in's bug never puts a NaN into the advantages."""
        out = {}
        for name, tool in self.tools.items():
            try:
                value = tool.calc_reward(instance_id, **kwargs)
            except Exception:  # noqa: BLE001 - a tool's bug, logged in full
                log.warning("tool %s raised in calc_reward", name, exc_info=True)
                value = 0.0
            if _not_a_reward(value):
                log.warning("tool %s: calc_reward gave %r, not a finite number; counted 0",
                            name, value)
                value = 0.0
            out[name] = float(value)
        return out

    def release(self, instance_id: str) -> None:
        for tool in self.tools.values():
            tool.release(instance_id)
