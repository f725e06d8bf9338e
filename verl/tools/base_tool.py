"""``BaseTool``: the stateful tool contract of verl's agent loop, for tools declared in a tool config YAML.

A subclass is built once per process as ``cls(config=<the YAML entry's config dict>, tool_schema=<its
OpenAIFunctionToolSchema or None>)`` (see :mod:`verl.tools.tool_registry`). Its ``name`` is
``tool_schema.function.name``; with ``tool_schema=None`` the subclass must supply the schema by overriding
:meth:`BaseTool.get_openai_tool_schema`, else construction fails with :class:`verl.utils.errors.ValidationError`
(a ``ValueError`` that is also the ``AssertionError`` verl raises there).

Life cycle, all coroutines, for one trajectory's use of the tool:

- ``create(instance_id=None, **kwargs) -> (instance_id, ToolResponse)``: start an instance; a fresh uuid4 string
  when ``instance_id`` is None. verl's loop passes ``create_kwargs=<dataset tools_kwargs[name]["create_kwargs"]>``.
- ``execute(instance_id, parameters, **kwargs) -> (ToolResponse, step_reward, metrics)``: run one call with the
  model's decoded arguments (verl's loop also passes ``agent_data=``). The base class answers
  ``ToolResponse(text="Updated the tool state.")``, ``0.0``, ``{}``.
- ``calc_reward(instance_id, **kwargs) -> float``: the reward the instance's state earns (base: ``0.0``).
- ``release(instance_id, **kwargs) -> None``: drop the instance's state (base: nothing to drop).

Per-trajectory state is the subclass's, keyed by ``instance_id`` (e.g. a dict filled in ``create`` and emptied in
``release``); the tool object itself is shared by every trajectory running in the process, concurrently.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from uuid import uuid4

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.errors import ValidationError

__all__ = ["BaseTool"]

logger = logging.getLogger(__name__)


class BaseTool:
    """Base class of stateful tools: schema, then ``create`` / ``execute`` / ``calc_reward`` / ``release``.

    Args:
        config: the tool's ``config`` mapping from the tool config YAML (kept as ``self.config``).
        tool_schema: the OpenAI schema the model sees; ``None`` to take it from ``get_openai_tool_schema()``.
    """

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None):
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValidationError(
                f"{type(self).__name__}: Tool schema is not set! Give a `tool_schema` in the tool config YAML "
                "or override get_openai_tool_schema()."
            )
        self.name = self.tool_schema.function.name
        schema = self.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
        logger.info("tool %s: %s", self.name, json.dumps(schema))

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The schema shown to the model (base: the one given to the constructor; ``None`` before it is set)."""
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        """Start an instance for one trajectory: its id (``instance_id``, else a new uuid4) and an empty response."""
        return (str(uuid4()) if instance_id is None else instance_id), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """Run one call with the model's decoded ``parameters``; returns (response, step reward, metrics)."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        """The reward this instance's state earns (base: 0.0)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        """Drop this instance's state (base: there is none)."""
