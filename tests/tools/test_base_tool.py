"""verl.tools.base_tool.BaseTool: constructor, defaults of the life cycle, and a subclass's per-instance state."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.tools._user_tools import CounterTool, SchemaFromClassTool
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.errors import ValidationError

SCHEMA = OpenAIFunctionToolSchema.model_validate(
    {
        "type": "function",
        "function": {
            "name": "counter",
            "description": "Count.",
            "parameters": {"type": "object", "properties": {"step": {"type": "integer"}}, "required": []},
        },
    }
)


def test_constructor_keeps_config_and_takes_name_from_schema():
    tool = BaseTool(config={"k": 1}, tool_schema=SCHEMA)
    assert tool.config == {"k": 1}
    assert tool.name == "counter"
    assert tool.get_openai_tool_schema() is SCHEMA


def test_missing_schema_is_refused_as_value_and_assertion_error():
    with pytest.raises(ValidationError, match="Tool schema is not set"):
        BaseTool(config={}, tool_schema=None)
    assert issubclass(ValidationError, AssertionError) and issubclass(ValidationError, ValueError)


def test_schema_from_overridden_getter():
    tool = SchemaFromClassTool(config={}, tool_schema=None)
    assert tool.name == "from_class"


def test_base_life_cycle_defaults():
    tool = BaseTool(config={}, tool_schema=SCHEMA)

    async def run():
        given_id, given_response = await tool.create("traj-1", create_kwargs={"x": 1})
        new_id, _ = await tool.create()
        response, reward, metrics = await tool.execute(given_id, {"step": 2})
        return given_id, given_response, new_id, response, reward, metrics, await tool.calc_reward(given_id)

    given_id, given_response, new_id, response, reward, metrics, final = asyncio.run(run())
    assert given_id == "traj-1"
    assert given_response == ToolResponse()
    assert uuid.UUID(new_id).version == 4  # a fresh uuid4 string when no id is given
    assert response.text == "Updated the tool state."
    assert (reward, metrics, final) == (0.0, {}, 0.0)
    assert asyncio.run(tool.release(given_id)) is None


def test_subclass_state_is_per_instance():
    tool = CounterTool(config={"reward_per_call": 0.25}, tool_schema=SCHEMA)

    async def run():
        a, _ = await tool.create(create_kwargs={"start": 10})
        b, _ = await tool.create()
        await tool.execute(a, {"step": 2})
        response, step_reward, metrics = await tool.execute(b, {})
        rewards = (await tool.calc_reward(a), await tool.calc_reward(b))
        await tool.release(a)
        return a, b, response, step_reward, metrics, rewards

    a, b, response, step_reward, metrics, rewards = asyncio.run(run())
    assert a != b
    # b started at 0 and stepped by the default 1 -> count 1; a started at 10 and stepped by 2 -> 12
    assert (response.text, step_reward, metrics) == ("count=1", 0.5, {"count": 1})
    assert rewards == (12 * 0.25, 1 * 0.25)  # 3.0 and 0.25
    assert a not in tool.counts and tool.counts == {b: 1}
