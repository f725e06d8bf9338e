"""verl.tools.function_tool: the decorator's forms and registry, calling, loading a file or module, returns."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading

import pytest

from verl.tools import function_tool as function_tool_module
from verl.tools.base_tool import BaseTool
from verl.tools.function_tool import (
    FUNCTION_TOOL_REGISTRY,
    FunctionTool,
    FunctionToolSchemaError,
    function_tool,
    get_function_tool,
    load_function_tools_from_path,
    normalize_function_tool_return,
)
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

TOOL_FILE = """
from verl.tools.function_tool import function_tool

@function_tool("shout")
def shout(text: str) -> str:
    '''Upper-case text.

    Args:
        text: the text.
    '''
    return text.upper()

@function_tool
async def halve(n: int) -> int:
    '''Halve n.

    Args:
        n: the number.
    '''
    return n // 2
"""


@pytest.fixture(autouse=True)
def _empty_registry():
    """Each test starts and ends with no function tools registered and no file loaded."""
    FUNCTION_TOOL_REGISTRY.clear()
    function_tool_module._LOADED_FUNCTION_TOOL_PATHS.clear()
    yield
    FUNCTION_TOOL_REGISTRY.clear()
    function_tool_module._LOADED_FUNCTION_TOOL_PATHS.clear()


def _write(tmp_path, body: str, name: str = "user_tools.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_bare_and_called_forms_register_and_return_the_function():
    def add(a: int, b: int = 1) -> int:
        """Add.

        Args:
            a: a.
            b: b.
        """
        return a + b

    assert function_tool(add) is add  # bare form
    assert function_tool("plus")(add) is add  # renamed: the same function under a second name
    assert function_tool()(add) is add  # called with no name: the function's name again (same fn -> allowed)
    assert sorted(FUNCTION_TOOL_REGISTRY) == ["add", "plus"]
    tool = get_function_tool("plus")
    assert isinstance(tool, FunctionTool) and not isinstance(tool, BaseTool)
    assert tool.tool_schema.function.name == "plus" and tool.is_async is False
    assert tool.tool_schema.function.parameters.required == ["a"]


def test_explicit_schema_dict_and_model_skip_inference():
    given = {"type": "function", "function": {"name": "raw", "description": "given"}}

    @function_tool("raw", schema=given)
    def raw(*anything):  # not inferable: proves inference is skipped
        return "ok"

    model = OpenAIFunctionToolSchema.model_validate(given)

    @function_tool(schema=model)
    def other(*anything):
        return "ok"

    assert FUNCTION_TOOL_REGISTRY["raw"].tool_schema.function.description == "given"
    assert FUNCTION_TOOL_REGISTRY["other"].tool_schema is model


def test_second_function_under_a_taken_name_is_refused():
    @function_tool("dup")
    def first(x: str) -> str:
        """First.

        Args:
            x: x.
        """

    def second(x: str) -> str:
        """Second.

        Args:
            x: x.
        """

    with pytest.raises(ValueError, match="already registered"):
        function_tool("dup")(second)
    assert FUNCTION_TOOL_REGISTRY["dup"].fn is first


def test_inference_error_surfaces_at_decoration():
    with pytest.raises(FunctionToolSchemaError, match="no docstring"):

        @function_tool
        def undocumented(x: int) -> int:
            return x

    assert "undocumented" not in FUNCTION_TOOL_REGISTRY


def test_get_unknown_tool_lists_registered():
    with pytest.raises(KeyError, match="not found in registry"):
        get_function_tool("nope")


def test_sync_runs_in_a_worker_thread_async_on_the_loop():
    seen = {}

    @function_tool
    def where_sync(tag: str) -> str:
        """Where.

        Args:
            tag: tag.
        """
        seen[tag] = threading.current_thread() is threading.main_thread()
        return tag

    @function_tool
    async def where_async(tag: str) -> str:
        """Where.

        Args:
            tag: tag.
        """
        seen[tag] = threading.current_thread() is threading.main_thread()
        return tag

    assert asyncio.run(get_function_tool("where_sync").call({"tag": "s"})) == "s"
    assert asyncio.run(get_function_tool("where_async").call({"tag": "a"})) == "a"
    assert get_function_tool("where_async").is_async is True
    assert seen == {"s": False, "a": True}


def test_load_file_returns_its_tools_once(tmp_path):
    path = _write(tmp_path, TOOL_FILE)
    first = load_function_tools_from_path(path)
    again = load_function_tools_from_path(path)
    assert [t.name for t in first] == ["halve", "shout"]  # sorted by name
    assert again == first and again[0] is first[0]  # not re-executed (which would raise "already registered")
    assert asyncio.run(first[0].call({"n": 9})) == 4  # 9 // 2
    assert asyncio.run(first[1].call({"text": "ab"})) == "AB"


def test_load_attributes_only_the_files_own_tools(tmp_path, monkeypatch):
    @function_tool
    def earlier(x: int) -> int:
        """Earlier.

        Args:
            x: x.
        """

    monkeypatch.chdir(tmp_path)
    _write(tmp_path, TOOL_FILE)
    tools = load_function_tools_from_path("user_tools.py")  # relative to the working directory
    assert sorted(t.name for t in tools) == ["halve", "shout"]
    assert "earlier" in FUNCTION_TOOL_REGISTRY


def test_load_dotted_module(tmp_path, monkeypatch):
    _write(tmp_path, TOOL_FILE, name="my_tool_module_for_test.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        tools = load_function_tools_from_path("my_tool_module_for_test")
        assert [t.name for t in tools] == ["halve", "shout"]
        # already imported (its tools registered then): the module's own functions are still found
        function_tool_module._LOADED_FUNCTION_TOOL_PATHS.clear()
        assert [t.name for t in load_function_tools_from_path("my_tool_module_for_test")] == ["halve", "shout"]
    finally:
        sys.modules.pop("my_tool_module_for_test", None)


def test_load_missing_path_and_empty_file(tmp_path, caplog):
    with pytest.raises(FileNotFoundError, match="function_tool_path does not exist"):
        load_function_tools_from_path(str(tmp_path / "absent.py"))
    with pytest.raises(FileNotFoundError, match="function_tool_path does not exist"):
        load_function_tools_from_path("no_such_module_anywhere_xyz")
    with caplog.at_level("WARNING"):
        assert load_function_tools_from_path(_write(tmp_path, "x = 1\n", name="empty.py")) == []
    assert any("no @function_tool decorators found" in r.getMessage() for r in caplog.records)


def test_load_file_that_raises_propagates_and_can_be_fixed(tmp_path):
    path = _write(tmp_path, "raise RuntimeError('broken tool file')\n")
    with pytest.raises(RuntimeError, match="broken tool file"):
        load_function_tools_from_path(path)
    _write(tmp_path, TOOL_FILE)  # the same path, fixed: loads (a failed load is not cached)
    assert len(load_function_tools_from_path(path)) == 2


def test_normalize_return_shapes():
    same = ToolResponse(text="r")
    assert normalize_function_tool_return(same)[0] is same
    assert normalize_function_tool_return("s") == (ToolResponse(text="s"), 0.0, {})
    assert normalize_function_tool_return({"t": "é"})[0].text == '{"t": "é"}'  # JSON, non-ASCII kept
    assert normalize_function_tool_return(42) == (ToolResponse(text="42"), 0.0, {})
    assert normalize_function_tool_return(("a",)) == (ToolResponse(text="a"), 0.0, {})
    assert normalize_function_tool_return(("a", 2)) == (ToolResponse(text="a"), 2.0, {})
    assert normalize_function_tool_return(({"k": 1}, None, {"m": 3})) == (ToolResponse(text='{"k": 1}'), 0.0, {"m": 3})
    response, reward, metrics = normalize_function_tool_return(("a", False, None))
    assert (reward, metrics) == (0.0, {}) and isinstance(reward, float)


@pytest.mark.parametrize("bad", [(), ("a", 1.0, {}, "extra")])
def test_normalize_refuses_tuples_of_other_lengths(bad):
    with pytest.raises(TypeError, match="length 1, 2, or 3"):
        normalize_function_tool_return(bad)
