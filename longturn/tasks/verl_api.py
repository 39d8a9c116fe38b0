"""verl's tool and interaction API under this project's name, so a verl tool or interaction runs
here after changing only its imports:

    from verl.tools.base_tool import BaseTool                               # verl
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse   # verl
    from verl.interactions.base import BaseInteraction                      # verl
    from verl.utils.rollout_trace import rollout_trace_op                   # verl
    from verl.utils.reward_score import gsm8k                               # verl
    from longturn.tasks.verl_api import (BaseInteraction, BaseTool,         # here
                                         OpenAIFunctionToolSchema, ToolResponse, rollout_trace_op)
    from longturn.tasks.verl_api import gsm8k                               # here

The names, signatures, `async` methods and return shapes are verl's (verl/tools/base_tool.py,
verl/tools/schemas.py, verl/interactions/base.py; `gsm8k`, the scorer verl's GSM8K tool and
interaction import: tasks/gsm8k_score.py); the code is this project's, run by `ToolBox`
(tasks/tools.py) and the conversation rollout. What they return is data: text, images, numbers;
nothing of it is executed.

The schema models keep every key they are given (`extra="allow"`), so a parameter schema with
`items`, `anyOf` or `minimum` reaches the chat template and the argument check whole, where
verl's would drop it.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from pydantic import BaseModel, ConfigDict, Field, field_validator

from longturn.tasks import gsm8k_score as gsm8k  # noqa: F401 - verl's name, re-exported


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class OpenAIFunctionPropertySchema(_Open):
    """One parameter (a JSON Schema; `type`, `description`, `enum` as verl names them)."""

    type: str | list[str] | None = None
    description: str | None = None
    enum: list[Any] | None = None


class OpenAIFunctionParametersSchema(_Open):
    type: str = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(_Open):
    name: str
    description: str = ""
    parameters: OpenAIFunctionParametersSchema = Field(
        default_factory=OpenAIFunctionParametersSchema)
    strict: bool = False


class OpenAIFunctionToolSchema(_Open):
    """A tool's OpenAI function schema: `{type: function, function: {name, description,
    parameters}}`, what a verl tool's constructor is given as `tool_schema`."""

    type: str
    function: OpenAIFunctionSchema


class ToolResponse(BaseModel):
    """What a tool call gives the model: text, and images shown in the tool message (a list,
    as verl requires; each a PIL image or an H×W×3 array). Unknown fields (verl's `video`) are
    refused rather than dropped."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    text: str | None = None
    image: list[Any] | None = None

    @field_validator("image", mode="before")
    @classmethod
    def _a_list(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, list):
            raise ValueError(f"image must be a list of images, got a {type(value).__name__}: "
                             "wrap a single image as [image]")
        return value

    def is_empty(self) -> bool:
        return not self.text and not self.image

    def is_text_only(self) -> bool:
        return bool(self.text) and not self.image


def rollout_trace_op(method: Any) -> Any:
    """verl's tracing decorator; here it changes nothing (runs are audited from the Parquet)."""
    return method


class BaseTool:
    """A verl-style tool: `create` per episode, `execute` per call → (ToolResponse or str, step
    reward, metrics), `calc_reward` at the end, `release` after; all coroutines."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__}: no tool_schema in the tools file and "
                             "get_openai_tool_schema() gives none")
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: str | None = None, **kwargs: Any
                     ) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict]:
        raise NotImplementedError(f"{type(self).__name__} does not implement execute")

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None


class BaseInteraction:
    """A verl-style interaction: constructed with its config (which holds its `name`), then per
    episode `start_interaction`, `generate_response` per reply → (should_terminate, text,
    score, metrics), `finalize_interaction` at the end; all coroutines."""

    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.name: str = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        return instance_id or str(uuid4())

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs: Any) -> tuple[bool, str, float, dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__} does not implement generate_response")

    async def calculate_score(self, instance_id: str | None = None, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        return None
