"""Tools as a user would write them against verl's API, imported by dotted name from the YAML tests.

``CounterTool`` keeps per-instance state (a call count and a reward it earns); ``SchemaFromClassTool`` supplies its
schema itself (the YAML entry has no ``tool_schema``); ``NotATool`` is a class that is not a ``BaseTool``.
"""

from __future__ import annotations

from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


class CounterTool(BaseTool):
    """Counts the calls of each instance; ``calc_reward`` is the count times ``config["reward_per_call"]``."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        self.counts: dict[str, int] = {}

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id, response = await super().create(instance_id, **kwargs)
        self.counts[instance_id] = int(kwargs.get("create_kwargs", {}).get("start", 0))
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        self.counts[instance_id] += int(parameters.get("step", 1))
        return ToolResponse(text=f"count={self.counts[instance_id]}"), 0.5, {"count": self.counts[instance_id]}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return self.counts[instance_id] * float(self.config["reward_per_call"])

    async def release(self, instance_id: str, **kwargs) -> None:
        del self.counts[instance_id]


class SchemaFromClassTool(BaseTool):
    """A tool that brings its own schema (``tool_schema=None`` in the YAML)."""

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.model_validate(
            {"type": "function", "function": {"name": "from_class", "description": "Schema defined by the class."}}
        )


class NotATool:
    """Has the constructor shape but is no BaseTool subclass."""

    def __init__(self, config: dict, tool_schema: Any):
        self.config = config
