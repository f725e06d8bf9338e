"""Load the tools a rollout offers: ``BaseTool`` classes from a tool config YAML, ``@function_tool`` functions.

The YAML format (``actor_rollout_ref.rollout.multi_turn.tool_config_path``) is verl's::

    tools:
      - class_name: my_pkg.my_tools.MyTool        # dotted path of a BaseTool subclass, imported here
        config:                                   # any mapping, given to the constructor as `config`
          type: native                            # "native" (the default when left out); "mcp" is refused
        tool_schema:                              # optional OpenAIFunctionToolSchema; None -> the class supplies it
          type: function
          function: {name: my_tool, description: ..., parameters: {type: object, properties: {...}, required: []}}

:func:`initialize_tools_from_config` builds one instance per entry, ``cls(config=<dict>, tool_schema=<model or
None>)``, every call anew. :func:`load_all_tools` adds the function tools of
``multi_turn.function_tool_path`` (loaded once per process, :mod:`verl.tools.function_tool`) and refuses a name
that both sources define.

Errors, each naming the file and the entry: ``FileNotFoundError`` for a missing YAML; ``ValueError`` for a file
without a ``tools:`` list, an entry without ``class_name``, a ``tool_schema`` that does not validate, two tools of
one name, and for MCP tools (``type: mcp``, ``mcp_servers_config_path``, verl's ``mcp_*`` tool modules) and verl's
image tools, which this project leaves out (tool responses are text only); ``ImportError`` for a class that cannot
be imported; ``TypeError`` for a ``class_name`` that is not a ``BaseTool`` subclass.
"""

from __future__ import annotations

import importlib
import logging
import os
from enum import Enum
from typing import Any

import pydantic
from omegaconf import OmegaConf

from verl.tools.base_tool import BaseTool
from verl.tools.function_tool import FunctionTool, load_function_tools_from_path
from verl.tools.schemas import OpenAIFunctionToolSchema

__all__ = ["ToolType", "get_tool_class", "initialize_tools_from_config", "load_all_tools"]

logger = logging.getLogger(__name__)

# verl tool modules of features this project leaves out -> why
_OUT_OF_SCOPE_MODULES = {
    "verl.tools.mcp_base_tool": "MCP tools are not supported",
    "verl.tools.mcp_search_tool": "MCP tools are not supported",
    "verl.tools.image_zoom_in_tool": "multimodal tool responses (images/videos) are not supported",
}


class ToolType(Enum):
    """The kinds of tool a YAML entry's ``config.type`` may name; only native Python tools are built."""

    NATIVE = "native"


def get_tool_class(cls_name: str) -> type[BaseTool]:
    """Import the ``BaseTool`` subclass named by the dotted path ``cls_name`` ("package.module.ClassName")."""
    module_name, _, class_name = cls_name.rpartition(".")
    if not module_name or not class_name:
        raise ValueError(f"class_name must be a dotted path 'package.module.ClassName', got {cls_name!r}")
    if module_name in _OUT_OF_SCOPE_MODULES:
        raise ValueError(f"tool class {cls_name}: {_OUT_OF_SCOPE_MODULES[module_name]} in this project")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(f"cannot import module {module_name!r} of tool class {cls_name!r}: {err}") from err
    tool_cls = getattr(module, class_name, None)
    if tool_cls is None:
        raise ImportError(f"module {module_name!r} has no attribute {class_name!r} (tool class {cls_name!r})")
    if not (isinstance(tool_cls, type) and issubclass(tool_cls, BaseTool)):
        raise TypeError(f"tool class {cls_name!r} is not a subclass of verl.tools.base_tool.BaseTool: {tool_cls!r}")
    return tool_cls


def _tool_type(config: dict[str, Any], where: str) -> ToolType:
    kind = str(config.get("type", "native")).lower()
    if kind == "mcp" or "mcp_servers_config_path" in config:
        raise ValueError(f"{where}: MCP tools (type: mcp) are not supported in this project; use a native tool")
    try:
        return ToolType(kind)
    except ValueError:
        raise ValueError(f"{where}: config.type {kind!r} is not a supported tool type; use 'native'") from None


def _tool_schema(entry: dict[str, Any], where: str) -> OpenAIFunctionToolSchema | None:
    raw = entry.get("tool_schema")
    if raw is None:
        return None
    try:
        return OpenAIFunctionToolSchema.model_validate(raw)
    except pydantic.ValidationError as err:
        raise ValueError(f"{where}: bad tool_schema: {err}") from err


def _read_entries(tools_config_file: str) -> list[Any]:
    if not os.path.isfile(tools_config_file):
        raise FileNotFoundError(f"tool config file (multi_turn.tool_config_path) does not exist: {tools_config_file}")
    data = OmegaConf.to_container(OmegaConf.load(tools_config_file), resolve=True)
    entries = data.get("tools") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{tools_config_file}: expected a top-level `tools:` list of tool entries")
    return entries


def _build_tool(entry: Any, where: str) -> BaseTool:
    if not isinstance(entry, dict) or not entry.get("class_name"):
        raise ValueError(f"{where}: each tool entry needs a `class_name` (dotted path of a BaseTool subclass)")
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ValueError(f"{where}: `config` must be a mapping, got {type(config).__name__}")
    _tool_type(config, where)
    try:
        tool_cls = get_tool_class(entry["class_name"])
    except (ImportError, TypeError, ValueError) as err:
        raise type(err)(f"{where}: {err}") from err
    return tool_cls(config=config, tool_schema=_tool_schema(entry, where))


def initialize_tools_from_config(tools_config_file: str) -> list[BaseTool]:
    """One instance of every tool the YAML file declares, in file order (format and errors: module docstring)."""
    tools: list[BaseTool] = []
    for index, entry in enumerate(_read_entries(tools_config_file)):
        where = f"{tools_config_file}: tools[{index}]"
        if isinstance(entry, dict) and entry.get("class_name"):
            where += f" ({entry['class_name']})"
        tool = _build_tool(entry, where)
        if any(other.name == tool.name for other in tools):
            raise ValueError(f"{where}: a second tool named {tool.name!r}; tool names must be unique")
        tools.append(tool)
    return tools


def load_all_tools(tool_config_path: str | None, function_tool_path: str | None) -> list[BaseTool | FunctionTool]:
    """The YAML's ``BaseTool`` instances followed by the function tools; ``[]`` when both paths are None.

    ``ValueError`` lists every function tool whose name a YAML tool already has (sorted).
    """
    native_tools = initialize_tools_from_config(tool_config_path) if tool_config_path else []
    function_tools = load_function_tools_from_path(function_tool_path) if function_tool_path else []
    taken = {tool.name for tool in native_tools}
    collisions = sorted(tool.name for tool in function_tools if tool.name in taken)
    if collisions:
        raise ValueError(
            f"Function tool name(s) {collisions} collide with tools already declared in '{tool_config_path}'. "
            "Each tool name must be unique across `tool_config_path` and `function_tool_path`; rename one of them."
        )
    return [*native_tools, *function_tools]
