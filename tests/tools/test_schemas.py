"""verl.tools.schemas: the OpenAI-format models, their defaults and the ToolResponse checks."""

from __future__ import annotations

import pydantic
import pytest

from verl.tools.schemas import (
    OpenAIFunctionCallSchema,
    OpenAIFunctionParsedSchema,
    OpenAIFunctionPropertySchema,
    OpenAIFunctionSchema,
    OpenAIFunctionToolCall,
    OpenAIFunctionToolSchema,
    ToolResponse,
)


def test_tool_schema_defaults_and_dropped_extras():
    schema = OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": "f",
                "description": "d",
                "parameters": {
                    "type": "object",
                    "properties": {"xs": {"type": "array", "items": {"type": "integer"}}},
                },
            },
        }
    )
    assert schema.function.strict is False
    assert schema.function.parameters.required == []  # `required` left out -> none required
    # JSON-schema keys beyond type/description/enum are dropped, as in verl
    assert schema.model_dump(exclude_none=True)["function"]["parameters"]["properties"]["xs"] == {"type": "array"}


def test_function_without_parameters_gets_an_empty_object():
    function = OpenAIFunctionSchema(name="noop", description="nothing")
    assert function.parameters.model_dump() == {"type": "object", "properties": {}, "required": []}


def test_property_type_list_and_non_string_enum():
    prop = OpenAIFunctionPropertySchema(type=["integer", "number"], enum=[1, 2, 3])
    assert prop.type == ["integer", "number"]
    assert prop.enum == [1, 2, 3]
    with pytest.raises(pydantic.ValidationError):
        OpenAIFunctionPropertySchema(description="no type")


def test_parsed_call_decodes_json_object():
    call, has_error = OpenAIFunctionCallSchema.from_openai_function_parsed_schema(
        OpenAIFunctionParsedSchema(name="calc", arguments='{"expression": "1+2"}')
    )
    assert has_error is False
    assert call.arguments == {"expression": "1+2"}


@pytest.mark.parametrize("arguments", ["{not json", "[1, 2]", "3", ""])
def test_parsed_call_with_bad_arguments_flags_error(arguments):
    call, has_error = OpenAIFunctionCallSchema.from_openai_function_parsed_schema(
        OpenAIFunctionParsedSchema(name="calc", arguments=arguments)
    )
    assert has_error is True
    assert call.name == "calc" and call.arguments == {}


def test_tool_call_type_is_function_only():
    call = OpenAIFunctionToolCall(id="c0", function={"name": "f", "arguments": {}})
    assert call.type == "function"
    with pytest.raises(pydantic.ValidationError):
        OpenAIFunctionToolCall(id="c0", type="other", function={"name": "f", "arguments": {}})


def test_tool_response_predicates():
    assert ToolResponse().is_empty()
    assert ToolResponse(text="hi").is_text_only()
    assert not ToolResponse(text="hi").has_multimodal()
    assert ToolResponse(image=[], video=[]).has_multimodal() is False  # empty lists carry nothing
    with_image = ToolResponse(text="see", image=["<img>"])
    assert with_image.has_multimodal() and not with_image.is_text_only() and not with_image.is_empty()
    assert ToolResponse(video=["<vid>"]).has_multimodal()


@pytest.mark.parametrize("field", ["image", "video"])
def test_tool_response_media_must_be_a_list(field):
    with pytest.raises(pydantic.ValidationError, match="must be a list"):
        ToolResponse(**{field: "single-item"})
    assert getattr(ToolResponse(**{field: None}), field) is None
