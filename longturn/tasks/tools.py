"""Tools the model calls during an episode, declared in YAML, one instance per episode.

    tools:
      - class: longturn.tasks.calculator:CalculatorTool   # a BaseTool subclass
        config: {max_length: 200}                         # passed to its constructor
        schema:                                           # OpenAI function schema, given to the
          type: function                                  # chat template's `tools=`
          function: {name: calculator, description: …, parameters: {…JSON Schema…}}

verl's spelling loads too (`class_name`, `config` with `type: native`, `tool_schema`), and a
class may be this project's synchronous `BaseTool` below or a verl-style async one
(`longturn.tasks.verl_api.BaseTool`). The protocol is verl's: `create` when an episode starts,
`execute` per call, `calc_reward` at the end, `release` after. `ToolBox` runs the calls of many
episodes at once and turns every mistake of the model or of a tool into an `Error: …` result.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
from pydantic import ValidationError

from longturn.errors import SettingError
from longturn.tasks import verl_api
from longturn.tasks.plugin_loop import CallTimedOut, invoke, run_together, within
from longturn.tasks.plugins import EpisodeInstances, entry_keys, import_class, read_entries
from longturn.tasks.tool_calls import BadToolCall, ToolCall

log = logging.getLogger(__name__)


class BaseTool(EpisodeInstances):
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
    images: list[np.ndarray] = field(default_factory=list)  # a ToolResponse's, as frames

    @property
    def failed(self) -> bool:
        """The one rule of a failed call: it could not run, or its text reads as an error."""
        return self.error is not None or is_error_text(self.text)


def is_error_text(content: Any) -> bool:
    """Whether a tool message tells the model its call failed: the tool box writes every call
    it could not run as `Error: …`, and a tool says its own refusals the same way (the
    calculator's `Error: division by zero`). Read from the text alone, so a collector that only
    sees messages (an agent's, a rollout function's) counts failed calls as the rollout does."""
    return str(content).startswith("Error:")


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


# a tools entry's keys: verl's name → this project's
_TOOL_KEYS = {"class_name": "class", "tool_schema": "schema", "config": "config"}


def _build_tool(cls: type, config: dict[str, Any], schema: dict[str, Any] | None, where: str,
                verl_spelled: bool) -> Any:
    """The tool of one entry, its schema checked already (None: a verl-spelled entry gave none).
    A verl-style class gets what verl gives it (the whole config, the schema as an
    OpenAIFunctionToolSchema, keyword arguments); this project's gets the config without verl's
    `type` and the schema as a dict."""
    if issubclass(cls, verl_api.BaseTool):
        if schema is not None:
            try:
                schema = verl_api.OpenAIFunctionToolSchema.model_validate(schema)
            except ValidationError as err:
                first = err.errors()[0]
                raise SettingError(f"{where}: tool_schema {'.'.join(map(str, first['loc']))}: "
                                   f"{first['msg']}") from err
        tool = cls(config=config, tool_schema=schema)
        _check_schema(schema_of(tool), where)
        return tool
    if schema is None:
        raise SettingError(f"{where}: no 'tool_schema': {cls.__name__} is this project's tool "
                           "class, which is given its schema; only a verl-style class makes one")
    if verl_spelled:
        config = {k: v for k, v in config.items() if k != "type"}
    return cls(config, schema)


def load_tools(path: str | Path) -> list[Any]:
    """Every tool listed in a tools YAML file, built: this project's spelling (`class`, `config`,
    `schema`) or verl's (`class_name`, `config` with `type: native`, `tool_schema`)."""
    tools: list[Any] = []
    for i, raw in enumerate(read_entries(path, "tools")):
        where = f"{path} tools[{i}]"
        if not isinstance(raw.get("config", {}) or {}, dict):
            raise SettingError(f"{where}: 'config' must be a mapping")
        verl_spelled = "class_name" in raw
        if verl_spelled and "mcp" in raw:
            raise SettingError(f"{where}: MCP tools (verl's 'mcp' entry) are not supported; "
                               "tools here are classes")
        entry = entry_keys(raw, where, _TOOL_KEYS)
        config = dict(entry.get("config") or {})
        # verl reads `type` (how to build the tool): only `native` tools exist here, no MCP server
        if verl_spelled and config.get("type", "native") != "native":
            raise SettingError(f"{where}: config.type {config['type']!r} is not supported; tools "
                               "here are classes (verl's 'native')")
        schema = entry.get("schema")
        if schema is not None or not verl_spelled:  # verl's spelling may leave it to the class
            _check_schema(schema, where)
        cls = import_class(entry.get("class"), where)
        if not (isinstance(cls, type) and issubclass(cls, (BaseTool, verl_api.BaseTool))):
            raise SettingError(f"{where}: {entry['class']!r} is not a tool class: subclass "
                               "longturn.tasks.tools.BaseTool, or a verl tool with its import "
                               "changed to `from longturn.tasks.verl_api import BaseTool`")
        tools.append(_build_tool(cls, config, schema, where, verl_spelled))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise SettingError(f"{path}: tool names repeat: {names}")
    return tools


def schema_of(tool: Any) -> dict[str, Any]:
    """A tool's OpenAI function schema as a dict (what the chat template and the argument check
    read)."""
    if isinstance(tool, verl_api.BaseTool):
        return tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
    return tool.schema


def _not_a_reward(value: Any) -> bool:
    """Whether a tool's reward would break training: not a number, or NaN or infinite."""
    if isinstance(value, (str, bytes)):
        return True
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


def _broken_result(returned: Any) -> str | None:
    """What is wrong with `execute`'s return value, or None when it keeps the protocol: (text or
    ToolResponse, finite reward, metrics mapping or None). A dict's repr is no tool result, a
    NaN reward would reach every advantage of the batch."""
    if not (isinstance(returned, (tuple, list)) and len(returned) == 3):
        return f"a {type(returned).__name__}, not (text, reward, metrics)"
    text, reward, metrics = returned
    if not isinstance(text, (str, verl_api.ToolResponse)):
        return f"a {type(text).__name__} as its text, not a str"
    if _not_a_reward(reward):
        return f"the reward {reward!r}, not a finite number"
    if metrics is not None and not isinstance(metrics, Mapping):
        return f"metrics of type {type(metrics).__name__}, not a mapping"
    return None


def _frame(image: Any) -> np.ndarray:
    """A tool's image as the rollout's frames are: an H×W×3 uint8 array (a PIL image is
    converted to RGB)."""
    if hasattr(image, "convert"):  # a PIL image
        image = image.convert("RGB")
    frame = np.asarray(image)
    if frame.ndim != 3 or frame.shape[-1] != 3 or frame.dtype != np.uint8:
        raise ValueError(f"an image of shape {frame.shape} and dtype {frame.dtype}, not an "
                         "H×W×3 uint8 picture")
    return frame


def _result(name: str, returned: tuple) -> ToolResult:
    """A kept-protocol return value as a ToolResult (a ToolResponse's text and frames)."""
    text, reward, metrics = returned
    images: list[np.ndarray] = []
    if isinstance(text, verl_api.ToolResponse):
        try:
            images = [_frame(image) for image in text.image or []]
        except (TypeError, ValueError) as err:
            return ToolResult(name, f"Error: {name} returned {err}", error="bad_result")
        text = text.text or ""
    return ToolResult(name, text, float(reward), dict(metrics or {}), images=images)


class ToolBox:
    """The tools of a run, dispatching episodes' calls by name: this project's synchronous tools
    and verl-style async ones alike, every call of a batch at once on the plug-in loop
    (tasks/plugin_loop.py), each cut off after `timeout_s` seconds (None: no limit)."""

    def __init__(self, tools: list[Any]):
        self.tools = {t.name: t for t in tools}
        self._schemas = {t.name: schema_of(t) for t in tools}
        self._validators = {name: jsonschema.Draft202012Validator(
            schema["function"].get("parameters") or {"type": "object", "properties": {}})
            for name, schema in self._schemas.items()}
        self._ids: dict[tuple[str, str], str] = {}  # (tool, episode) → the tool's instance id

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return list(self._schemas.values())

    # ---- many episodes at once (the rollout's batches) ----------------------------------------

    def create_many(self, episodes: list[tuple[str, dict[str, dict[str, Any]] | None]],
                    timeout_s: float | None) -> None:
        """Start every tool's state for each episode; a tool that fails here ends the run (it
        cannot serve the episode), naming the tool."""
        run_together([lambda t=tool, e=episode, k=kwargs: self._create(t, e, k or {}, timeout_s)
                      for episode, kwargs in episodes for tool in self.tools.values()])

    def rewards_many(self, instance_ids: list[str], timeout_s: float | None
                     ) -> list[dict[str, float]]:
        """Each episode's reward from each tool; one that raises, hangs or is not a finite
        number counts 0 (and is logged), so a plug-in's bug never puts a NaN into the
        advantages."""
        names = list(self.tools)
        values = run_together([lambda n=name, e=episode: self._reward(n, e, timeout_s)
                               for episode in instance_ids for name in names])
        return [dict(zip(names, values[i * len(names):(i + 1) * len(names)]))
                for i in range(len(instance_ids))]

    def release_many(self, instance_ids: list[str], timeout_s: float | None) -> None:
        """Free each episode's tool state; a tool that fails here is logged, not fatal."""
        run_together([lambda n=name, e=episode: self._release(n, e, timeout_s)
                      for episode in instance_ids for name in self.tools])

    def cannot_keep(self) -> str | None:
        """Why running episodes cannot be kept in a checkpoint (a tool with no `episode_state`:
        a verl-style one), or None."""
        for name, tool in self.tools.items():
            if not hasattr(tool, "episode_state"):
                return f"tool {name!r} has no episode_state"
        return None

    def episode_states(self, instance_ids: list[str]) -> list[dict[str, Any]]:
        """Each episode's state in every tool (its instance id there, and `episode_state`)."""
        ids = [{name: self._ids.get((name, e), e) for name in self.tools} for e in instance_ids]
        return [{name: (i[name], tool.episode_state(i[name])) for name, tool in self.tools.items()}
                for i in ids]

    def restore_episodes(self, instance_ids: list[str], states: list[dict[str, Any]]) -> None:
        """Running episodes again from `episode_states` (a resumed run): no `create`."""
        for episode, state in zip(instance_ids, states):
            for name, (tool_id, kept) in state.items():
                self._ids[(name, episode)] = tool_id
                self.tools[name].restore_episode(tool_id, kept)

    # ---- the coroutines the batches run --------------------------------------------------------

    async def run(self, instance_id: str, call: ToolCall | BadToolCall,
                  timeout_s: float | None) -> ToolResult:
        """One call's result; every mistake of the model, and every exception, hang or broken
        return value of the tool, is an `Error:` result."""
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
        tool_id = self._ids.get((call.name, instance_id), instance_id)
        try:
            returned = await within(invoke(tool.execute, tool_id, call.arguments), timeout_s)
        except CallTimedOut:
            log.warning("tool %s did not return within %s s on %r", call.name, timeout_s,
                        call.arguments)
            return ToolResult(call.name, f"Error: {call.name} did not return within "
                              f"{timeout_s:g} s", error="tool_timeout")
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
        return _result(call.name, returned)

    async def _create(self, tool: Any, instance_id: str, tools_kwargs: dict[str, Any],
                      timeout_s: float | None) -> None:
        kwargs = dict(tools_kwargs.get(tool.name) or {})
        if isinstance(tool, verl_api.BaseTool):
            kwargs = _verl_create_kwargs(tool.create, kwargs)
        try:
            returned = await within(invoke(tool.create, instance_id, **kwargs), timeout_s)
        except CallTimedOut:
            raise RuntimeError(f"tool {tool.name}: create did not return within {timeout_s:g} s "
                               f"(episode {instance_id})") from None
        except Exception as err:
            raise RuntimeError(f"tool {tool.name}: create raised {type(err).__name__}: {err} "
                               f"(episode {instance_id})") from err
        # verl's create gives (instance_id, ToolResponse) or the instance id; ours gives None
        given = returned[0] if isinstance(returned, (tuple, list)) and returned else returned
        self._ids[(tool.name, instance_id)] = given if isinstance(given, str) else instance_id

    async def _reward(self, name: str, instance_id: str, timeout_s: float | None) -> float:
        tool = self.tools[name]
        try:
            value = await within(invoke(tool.calc_reward, self._ids.get(
                (name, instance_id), instance_id)), timeout_s)
        except Exception:  # noqa: BLE001 - a tool's bug or hang, logged in full
            log.warning("tool %s raised or hung in calc_reward", name, exc_info=True)
            value = 0.0
        if _not_a_reward(value):
            log.warning("tool %s: calc_reward gave %r, not a finite number; counted 0",
                        name, value)
            value = 0.0
        return float(value)

    async def _release(self, name: str, instance_id: str, timeout_s: float | None) -> None:
        tool_id = self._ids.pop((name, instance_id), instance_id)
        try:
            await within(invoke(self.tools[name].release, tool_id), timeout_s)
        except Exception:  # noqa: BLE001 - freeing state must not end the run; logged in full
            log.warning("tool %s raised or hung in release", name, exc_info=True)


def _verl_create_kwargs(create: Any, entry: dict[str, Any]) -> dict[str, Any]:
    """What a verl-style `create` is given from the task's `tools_kwargs[name]`: verl's data puts
    them under `create_kwargs`, which verl has passed both spread out and as one
    `create_kwargs=` keyword; both are given where the method's signature takes them."""
    if not isinstance(entry.get("create_kwargs"), Mapping):
        return entry
    create_kwargs = dict(entry["create_kwargs"])
    parameters = inspect.signature(create).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    out = {k: v for k, v in create_kwargs.items() if takes_any or k in parameters}
    if takes_any or "create_kwargs" in parameters:
        out["create_kwargs"] = create_kwargs
    return out
