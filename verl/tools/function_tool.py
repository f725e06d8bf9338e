"""``@function_tool``: a plain Python function as a stateless tool, with its schema inferred from the function.

Usage, in a file named by ``actor_rollout_ref.rollout.multi_turn.function_tool_path``::

    @function_tool                      # tool name = function name
    def add(a: int, b: int = 0) -> str:
        '''Add two integers.

        Args:
            a: the first number.
            b: the second number.
        '''
        return str(a + b)

    @function_tool("search", schema={...})   # another name; an explicit schema (dict or model) skips inference

Decorating registers a :class:`FunctionTool` in the process-wide :data:`FUNCTION_TOOL_REGISTRY` under the tool name
and returns the function unchanged. The schema comes from :func:`verl.tools.function_schema.
infer_function_tool_schema` (signature, type hints, docstring ``Args:``), whose :class:`FunctionToolSchemaError`
(a ``ValueError``) is raised at decoration time. A second, different function under a taken name raises
``ValueError`` ("already registered"); re-decorating the same function object replaces its entry.

A ``FunctionTool`` has no life cycle: ``await tool.call(parameters)`` runs the function with the model's arguments
as keywords, an ``async def`` directly and a plain ``def`` in a worker thread (so a slow tool does not stall the
event loop). :func:`normalize_function_tool_return` turns what it returned into ``(ToolResponse, reward, metrics)``.
``FunctionTool`` is deliberately not a :class:`~verl.tools.base_tool.BaseTool`: loops tell the two apart with
``isinstance(tool, FunctionTool)``.

:func:`load_function_tools_from_path` runs a Python file (or imports a dotted module) once per process and returns
the tools it registered; a second call with the same path returns the same objects.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl.tools.function_schema import FunctionToolSchemaError, infer_function_tool_schema
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = [
    "FUNCTION_TOOL_REGISTRY",
    "FunctionTool",
    "FunctionToolSchemaError",
    "function_tool",
    "get_function_tool",
    "load_function_tools_from_path",
    "normalize_function_tool_return",
]

logger = logging.getLogger(__name__)

#: tool name -> FunctionTool, for every ``@function_tool`` run in this process
FUNCTION_TOOL_REGISTRY: dict[str, FunctionTool] = {}

# path (absolute) or "module:<dotted name>" -> the tools that loading it registered
_LOADED_FUNCTION_TOOL_PATHS: dict[str, list[FunctionTool]] = {}


@dataclass
class FunctionTool:
    """A registered function tool: ``name``, the function ``fn``, its ``tool_schema`` and whether it is async."""

    name: str
    fn: Callable[..., Any]
    tool_schema: OpenAIFunctionToolSchema
    is_async: bool = False

    async def call(self, parameters: dict[str, Any]) -> Any:
        """Run the function with ``parameters`` as keyword arguments (a sync function in a worker thread)."""
        if self.is_async:
            return await self.fn(**parameters)
        return await asyncio.to_thread(self.fn, **parameters)


def _register(fn: Callable, tool_name: str, schema: OpenAIFunctionToolSchema | dict | None) -> None:
    if isinstance(schema, OpenAIFunctionToolSchema):
        tool_schema = schema
    elif isinstance(schema, dict):
        tool_schema = OpenAIFunctionToolSchema.model_validate(schema)
    else:
        tool_schema = infer_function_tool_schema(fn, tool_name)
    existing = FUNCTION_TOOL_REGISTRY.get(tool_name)
    if existing is not None and existing.fn is not fn:
        raise ValueError(
            f"Function tool '{tool_name}' is already registered to {existing.fn.__module__}."
            f"{existing.fn.__qualname__}; refusing to overwrite it with {fn.__module__}.{fn.__qualname__}. "
            "Give one of them another name: @function_tool('other_name')."
        )
    FUNCTION_TOOL_REGISTRY[tool_name] = FunctionTool(
        name=tool_name, fn=fn, tool_schema=tool_schema, is_async=inspect.iscoroutinefunction(fn)
    )
    logger.info("registered function tool %r from %s.%s", tool_name, fn.__module__, fn.__qualname__)


def function_tool(name: str | Callable | None = None, *, schema: OpenAIFunctionToolSchema | dict | None = None):
    """Register a function as a tool; use bare (``@function_tool``) or called (``@function_tool("name")``).

    Args:
        name: the tool name the model sees (default: the function's name). In the bare form this position
            receives the decorated function.
        schema: an ``OpenAIFunctionToolSchema`` or a dict of that shape, used as given instead of inferring one.

    Returns:
        The function itself (bare form), or a decorator that registers a function and returns it.
    """
    if callable(name):
        _register(name, name.__name__, schema)
        return name

    def decorator(fn: Callable) -> Callable:
        _register(fn, name or fn.__name__, schema)
        return fn

    return decorator


def get_function_tool(name: str) -> FunctionTool:
    """The registered tool ``name``; ``KeyError`` naming the registered ones when there is none."""
    if name not in FUNCTION_TOOL_REGISTRY:
        raise KeyError(
            f"Function tool '{name}' not found in registry (registered: {sorted(FUNCTION_TOOL_REGISTRY)}). Make "
            "sure its file is named by the rollout config's `multi_turn.function_tool_path`."
        )
    return FUNCTION_TOOL_REGISTRY[name]


def _exec_file(abs_path: str, shown: str) -> None:
    # a name derived from the path, so the file can import its siblings through sys.modules
    module_name = "_verl_function_tools_" + abs_path.replace(os.sep, "_").replace(".", "_")
    spec = importlib.util.spec_from_file_location(module_name, abs_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"Cannot create an import spec for function_tool_path: {shown}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise


def _is_module_name(path: str) -> bool:
    return not path.endswith(".py") and os.sep not in path and all(part.isidentifier() for part in path.split("."))


def _load_module(name: str) -> list[str]:
    """Import the dotted module ``name``; the names of the tools its functions registered."""
    before = set(FUNCTION_TOOL_REGISTRY)
    module = importlib.import_module(name)
    new = set(FUNCTION_TOOL_REGISTRY) - before
    # imported earlier (tools registered then): attribute the module's own functions
    new |= {key for key, tool in FUNCTION_TOOL_REGISTRY.items() if tool.fn.__module__ == module.__name__}
    return sorted(new)


def load_function_tools_from_path(path: str) -> list[FunctionTool]:
    """Load the ``@function_tool`` functions of a Python file (or dotted module); the tools it registered.

    Raises ``FileNotFoundError`` ("function_tool_path does not exist") when ``path`` is neither an existing file
    nor an importable module name. A file that registers nothing logs a warning and gives ``[]``.
    """
    abs_path = os.path.abspath(path)
    if os.path.isfile(abs_path):
        key = abs_path
    elif _is_module_name(path) and importlib.util.find_spec(path.split(".")[0]) is not None:
        key = f"module:{path}"
    else:
        raise FileNotFoundError(f"function_tool_path does not exist: {path} (give a .py file or a dotted module)")
    if key in _LOADED_FUNCTION_TOOL_PATHS:
        return _LOADED_FUNCTION_TOOL_PATHS[key]
    if key == abs_path:
        before = set(FUNCTION_TOOL_REGISTRY)
        _exec_file(abs_path, path)
        names = sorted(set(FUNCTION_TOOL_REGISTRY) - before)
    else:
        names = _load_module(path)
    if not names:
        logger.warning("function_tool_path '%s' loaded but no @function_tool decorators found; forgot one?", path)
    tools = [FUNCTION_TOOL_REGISTRY[name] for name in names]
    _LOADED_FUNCTION_TOOL_PATHS[key] = tools
    return tools


def _as_response(value: Any) -> ToolResponse:
    if isinstance(value, ToolResponse):
        return value
    if isinstance(value, str):
        return ToolResponse(text=value)
    if isinstance(value, dict):
        return ToolResponse(text=json.dumps(value, ensure_ascii=False))
    return ToolResponse(text=str(value))


def normalize_function_tool_return(ret: Any) -> tuple[ToolResponse, float, dict]:
    """A function tool's return value as ``(ToolResponse, reward, metrics)``.

    ``ToolResponse`` as is; ``str`` as its text; ``dict`` as JSON text; a tuple ``(response,)``,
    ``(response, reward)`` or ``(response, reward, metrics)`` (``None`` reward -> 0.0, ``None`` metrics -> {});
    anything else as ``str(ret)``. Reward 0.0 and metrics ``{}`` when not given. A tuple of another length
    raises ``TypeError`` (almost surely a bug in the tool).
    """
    if not isinstance(ret, tuple):
        return _as_response(ret), 0.0, {}
    if not 1 <= len(ret) <= 3:
        raise TypeError(
            f"@function_tool return tuple must have length 1, 2, or 3 (got length {len(ret)}: {ret!r}); "
            "return (response,), (response, reward) or (response, reward, metrics)."
        )
    reward = 0.0 if len(ret) < 2 or ret[1] is None else float(ret[1])
    metrics = {} if len(ret) < 3 or ret[2] is None else dict(ret[2])
    return _as_response(ret[0]), reward, metrics
