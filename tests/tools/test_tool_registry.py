"""verl.tools.tool_registry: verl's tool config YAML, function tool files beside it, and every loading error."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from tests.tools._user_tools import CounterTool, SchemaFromClassTool
from verl.tools import function_tool as function_tool_module
from verl.tools.calculator_tool import CalculatorTool
from verl.tools.function_tool import FUNCTION_TOOL_REGISTRY, FunctionTool
from verl.tools.tool_registry import ToolType, get_tool_class, initialize_tools_from_config, load_all_tools

USER_YAML = """\
tools:
  - class_name: tests.tools._user_tools.CounterTool
    config:
      type: native
      reward_per_call: 0.5
    tool_schema:
      type: function
      function:
        name: counter
        description: Count calls.
        parameters:
          type: object
          properties:
            step:
              type: integer
              description: how much to add.
          required: []
  - class_name: tests.tools._user_tools.SchemaFromClassTool
    config: {}
"""

FUNCTION_FILE = """\
from verl.tools.function_tool import function_tool

@function_tool
def echo(text: str) -> str:
    '''Echo.

    Args:
        text: text.
    '''
    return text
"""


@pytest.fixture(autouse=True)
def _empty_registry():
    FUNCTION_TOOL_REGISTRY.clear()
    function_tool_module._LOADED_FUNCTION_TOOL_PATHS.clear()
    yield
    FUNCTION_TOOL_REGISTRY.clear()
    function_tool_module._LOADED_FUNCTION_TOOL_PATHS.clear()


def _file(tmp_path, text: str, name: str = "tools.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_user_yaml_builds_configured_instances(tmp_path):
    tools = initialize_tools_from_config(_file(tmp_path, USER_YAML))
    assert [type(t) for t in tools] == [CounterTool, SchemaFromClassTool]
    counter, from_class = tools
    assert counter.name == "counter" and from_class.name == "from_class"
    assert counter.config == {"type": "native", "reward_per_call": 0.5}  # plain dict, `type` kept as in verl
    assert counter.tool_schema.function.parameters.properties["step"].description == "how much to add."

    async def run():
        instance_id, _ = await counter.create(create_kwargs={"start": 1})
        await counter.execute(instance_id, {"step": 3})
        return await counter.calc_reward(instance_id)

    assert asyncio.run(run()) == (1 + 3) * 0.5  # 2.0


def test_each_call_builds_new_instances(tmp_path):
    path = _file(tmp_path, USER_YAML)
    assert initialize_tools_from_config(path)[0] is not initialize_tools_from_config(path)[0]


def test_shipped_calculator_config():
    (tool,) = initialize_tools_from_config("verl/tools/configs/calculator_tool.yaml")
    assert isinstance(tool, CalculatorTool) and tool.name == "calculator"
    assert tool.tool_schema.function.parameters.required == ["expression"]


def test_load_all_tools_merges_native_then_function(tmp_path):
    tools = load_all_tools(_file(tmp_path, USER_YAML), _file(tmp_path, FUNCTION_FILE, "fns.py"))
    assert [t.name for t in tools] == ["counter", "from_class", "echo"]
    assert isinstance(tools[2], FunctionTool)
    assert load_all_tools(None, None) == []
    assert [t.name for t in load_all_tools(None, str(tmp_path / "fns.py"))] == ["echo"]


def test_function_tool_name_collision_lists_every_offender(tmp_path):
    colliding = FUNCTION_FILE.replace("def echo", "def counter") + FUNCTION_FILE.replace("def echo", "def from_class")
    with pytest.raises(ValueError, match=r"\['counter', 'from_class'\] collide"):
        load_all_tools(_file(tmp_path, USER_YAML), _file(tmp_path, colliding, "fns.py"))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        initialize_tools_from_config(str(tmp_path / "absent.yaml"))


ENTRY = "tools:\n  - class_name: {cls}\n    config: {config}\n"
COUNTER = "tests.tools._user_tools.CounterTool"
GOOD_SCHEMA = "    tool_schema: {type: function, function: {name: c, description: d}}\n"
# two entries whose schemas both name the tool "c"
TWO_OF_ONE_NAME = "tools:\n" + f"  - class_name: {COUNTER}\n    config: {{}}\n{GOOD_SCHEMA}" * 2


@pytest.mark.parametrize(
    ("text", "error", "words"),
    [
        ("other: 1\n", ValueError, "top-level `tools:` list"),
        ("tools:\n  - config: {}\n", ValueError, r"tools\[0\].*needs a `class_name`"),
        (ENTRY.format(cls=COUNTER, config="[1]"), ValueError, "`config` must be a mapping"),
        (ENTRY.format(cls="NoDots", config="{}"), ValueError, "dotted path"),
        (ENTRY.format(cls="no_such_pkg_xyz.Tool", config="{}"), ImportError, "cannot import module"),
        (ENTRY.format(cls="tests.tools._user_tools.Missing", config="{}"), ImportError, "has no attribute"),
        (ENTRY.format(cls="tests.tools._user_tools.NotATool", config="{}"), TypeError, "not a subclass of"),
        (ENTRY.format(cls="json.dumps", config="{}"), TypeError, "not a subclass of"),
        (ENTRY.format(cls=COUNTER, config="{type: mcp}"), ValueError, "MCP tools"),
        (ENTRY.format(cls=COUNTER, config="{mcp_servers_config_path: x.json}"), ValueError, "MCP tools"),
        (ENTRY.format(cls=COUNTER, config="{type: sandbox}"), ValueError, "'sandbox' is not a supported tool type"),
        (ENTRY.format(cls="verl.tools.mcp_search_tool.MCPSearchTool", config="{}"), ValueError, "MCP tools"),
        (ENTRY.format(cls="verl.tools.image_zoom_in_tool.ImageZoomInTool", config="{}"), ValueError, "multimodal"),
        (ENTRY.format(cls=COUNTER, config="{}") + "    tool_schema: {type: function}\n", ValueError, "bad tool_schema"),
        (ENTRY.format(cls=COUNTER, config="{}") + "    tool_schema: [1]\n", ValueError, "bad tool_schema"),
        (TWO_OF_ONE_NAME, ValueError, "a second tool named 'c'"),
    ],
)
def test_loading_errors(tmp_path, text, error, words):
    path = _file(tmp_path, text)
    with pytest.raises(error, match=words) as info:
        initialize_tools_from_config(path)
    assert path in str(info.value)  # the message names the file


def test_get_tool_class_and_tool_type():
    assert get_tool_class("verl.tools.calculator_tool.CalculatorTool") is CalculatorTool
    assert [t.value for t in ToolType] == ["native"]
