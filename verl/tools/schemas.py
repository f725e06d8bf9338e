"""The OpenAI-format data models every tool speaks: schemas a tool advertises, calls a model makes, responses.

A tool advertises itself to the model with an :class:`OpenAIFunctionToolSchema` (``{"type": "function",
"function": {"name", "description", "parameters": {"type": "object", "properties": {...}, "required": [...]}}}``),
the same dict a chat template's ``tools=`` argument takes. Fields beyond the modelled ones (``items``, ``nullable``,
``default`` ...) are dropped on validation, as in verl: a property keeps ``type`` (one JSON type or a list of them,
e.g. ``["integer", "number"]``), ``description`` and ``enum`` (any JSON values, so ``[1, 2, 3]`` is valid).

A tool call parsed out of the model's text arrives as :class:`OpenAIFunctionParsedSchema` (arguments still a JSON
string); :meth:`OpenAIFunctionCallSchema.from_openai_function_parsed_schema` decodes it and reports a decode error
as a flag (arguments ``{}``), never as an exception, because a malformed call is ordinary model output.

A tool answers with a :class:`ToolResponse`. Its ``image`` / ``video`` fields exist so that tools written for verl
construct it unchanged (each must be a list when given), but this project feeds tool output back as text only: a
caller checks :meth:`ToolResponse.has_multimodal` and refuses such a response with a clear error.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

__all__ = [
    "OpenAIFunctionCallSchema",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionParsedSchema",
    "OpenAIFunctionPropertySchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolCall",
    "OpenAIFunctionToolSchema",
    "ToolResponse",
]


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter of a function: its JSON type (or list of types), description and allowed values."""

    type: str | list[str]
    description: str | None = None
    enum: list[Any] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    """A function's parameters as a JSON-schema object; ``required`` defaults to none."""

    type: str
    properties: dict[str, OpenAIFunctionPropertySchema]
    required: list[str] = Field(default_factory=list)


def _no_parameters() -> OpenAIFunctionParametersSchema:
    return OpenAIFunctionParametersSchema(type="object", properties={}, required=[])


class OpenAIFunctionSchema(BaseModel):
    """A function the model may call: name, description, parameters (default: none) and the ``strict`` flag."""

    name: str
    description: str
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=_no_parameters)
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """A tool as a chat template's ``tools=`` list holds it: ``{"type": "function", "function": {...}}``."""

    type: str
    function: OpenAIFunctionSchema


class OpenAIFunctionParsedSchema(BaseModel):
    """A tool call as parsed from the model's text: the function name and its arguments as a JSON string."""

    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A tool call with decoded arguments (a dict)."""

    name: str
    arguments: dict[str, Any]

    @staticmethod
    def from_openai_function_parsed_schema(
        parsed_schema: OpenAIFunctionParsedSchema,
    ) -> tuple[OpenAIFunctionCallSchema, bool]:
        """Decode ``parsed_schema.arguments``; returns ``(call, has_decode_error)``.

        Arguments that are not JSON, or JSON that is not an object, give ``arguments={}`` and
        ``has_decode_error=True``.
        """
        try:
            arguments = json.loads(parsed_schema.arguments)
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            return OpenAIFunctionCallSchema(name=parsed_schema.name, arguments={}), True
        return OpenAIFunctionCallSchema(name=parsed_schema.name, arguments=arguments), False


class OpenAIFunctionToolCall(BaseModel):
    """An assistant message's tool call: its id, ``type="function"`` and the decoded call."""

    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCallSchema


class ToolResponse(BaseModel):
    """What a tool returns to the model: text, and (accepted, not fed back here) lists of images / videos."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _media_must_be_lists(cls, values: Any) -> Any:
        """A given ``image`` / ``video`` must be a list (wrap a single item: ``[img]``); ``None`` means absent."""
        if isinstance(values, dict):
            for field in ("image", "video"):
                value = values.get(field)
                if value is not None and not isinstance(value, list):
                    raise ValueError(
                        f"ToolResponse.{field} must be a list, got {type(value).__name__}; "
                        f"wrap a single item in a list, e.g. {{'{field}': [item]}}."
                    )
        return values

    def is_empty(self) -> bool:
        """True when there is neither text nor any image or video."""
        return not self.text and not self.image and not self.video

    def is_text_only(self) -> bool:
        """True when there is text and no image or video."""
        return bool(self.text) and not self.has_multimodal()

    def has_multimodal(self) -> bool:
        """True when a non-empty ``image`` or ``video`` list is set: a response this project's loop refuses."""
        return bool(self.image) or bool(self.video)
