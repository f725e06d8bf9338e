"""Infer a function tool's OpenAI schema from its signature, type hints and Google-style docstring.

``infer_function_tool_schema(fn, tool_name)`` builds what verl builds (verl delegates to
``transformers.utils.get_json_schema``; this is an own implementation of the same rules, so importing
:mod:`verl.tools` does not load transformers):

- ``function.description``: the docstring's text before its first section (``Args:``, ``Returns:`` ...).
- one property per parameter, each needing a type hint and a line in the docstring's ``Args:`` block (``name:
  text`` or ``name (type): text``, continued on more-indented lines). A description ending in ``(choices: [..])``
  (a JSON list) becomes the property's ``enum``.
- ``required``: the parameters without a default, in signature order.
- types: ``str`` -> string, ``int`` -> integer, ``float`` -> number, ``bool`` -> boolean, ``list``/``tuple``/``set``
  (any item type) -> array, ``dict`` -> object, ``None`` -> null, ``Literal[...]`` -> the values' type plus ``enum``,
  ``X | Y`` -> the list of both types (``int | float`` -> ``["integer", "number"]``), ``X | None`` / ``Optional[X]``
  -> ``X``'s type (the parameter stays required unless it has a default), ``Annotated[X, ...]`` -> ``X``.

Every failure raises :class:`FunctionToolSchemaError` (a ``ValueError``) naming the function, with the words verl's
errors use: "variadic parameter", "no docstring", "missing a type hint", "no description for the argument", and
"Couldn't parse this type hint" for a hint with no JSON type (``Any``, a custom class).
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any

from verl.tools.schemas import OpenAIFunctionToolSchema

__all__ = ["FunctionToolSchemaError", "infer_function_tool_schema", "parse_google_docstring"]

_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Return|Yields|Raises|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_CHOICES = re.compile(r"\(choices:\s*(\[.*\])\s*\)\s*$", re.DOTALL)
_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
_CONTAINERS = {list: "array", tuple: "array", set: "array", frozenset: "array", dict: "object"}


class FunctionToolSchemaError(ValueError):
    """A ``@function_tool`` function whose schema cannot be inferred; the message says what to fix."""


def _where(fn: Callable, tool_name: str) -> str:
    return f"@function_tool '{tool_name}' ({fn.__module__}.{fn.__qualname__})"


def parse_google_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """``(description, {argument: text})`` of a Google-style docstring; the description precedes any section."""
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section, current, base_indent = None, None, None
    for line in lines:
        stripped = line.strip()
        if _SECTION.match(stripped) and len(line) - len(line.lstrip()) == 0:
            section, current, base_indent = _SECTION.match(stripped).group(1), None, None
            continue
        if section is None:
            description.append(line)
        elif section in ("Args", "Arguments", "Parameters") and stripped:
            indent = len(line) - len(line.lstrip())
            base_indent = indent if base_indent is None else base_indent
            match = _ARG_LINE.match(stripped)
            if indent <= base_indent and match:
                current = match.group(1)
                args[current] = match.group(2).strip()
            elif current is not None:
                args[current] = f"{args[current]} {stripped}".strip()
    return "\n".join(description).strip(), args


def _literal_schema(values: tuple, hint: Any) -> dict[str, Any]:
    kinds = []
    for value in values:
        kind = _SCALARS.get(type(value))
        if kind is None:
            raise FunctionToolSchemaError(f"Couldn't parse this type hint: {hint!r} (a value has no JSON type)")
        if kind not in kinds:
            kinds.append(kind)
    return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(values)}


def _union_schema(members: tuple, hint: Any) -> dict[str, Any]:
    kinds: list[str] = []
    for member in members:
        if member is type(None):
            continue  # Optional[X]: X's type; whether it is required comes from the default
        member_type = _type_schema(member)["type"]
        for kind in member_type if isinstance(member_type, list) else [member_type]:
            if kind not in kinds:
                kinds.append(kind)
    if not kinds:
        raise FunctionToolSchemaError(f"Couldn't parse this type hint: {hint!r}")
    return {"type": kinds[0] if len(kinds) == 1 else kinds}


def _type_schema(hint: Any) -> dict[str, Any]:
    """The JSON-schema ``{"type": ...}`` (plus ``enum`` for a Literal) of one type hint."""
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _type_schema(typing.get_args(hint)[0])
    if origin is typing.Literal:
        return _literal_schema(typing.get_args(hint), hint)
    if origin is typing.Union or origin is types.UnionType:
        return _union_schema(typing.get_args(hint), hint)
    container = _CONTAINERS.get(origin or hint)
    if container is not None:
        return {"type": container}
    raise FunctionToolSchemaError(
        f"Couldn't parse this type hint, likely due to a custom class or object: {hint!r}. "
        "Use str, int, float, bool, list, dict, Literal[...] or a union of them."
    )


def _type_hints(fn: Callable, where: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception as err:  # a forward reference that does not resolve
        raise FunctionToolSchemaError(f"{where}: its type hints cannot be resolved: {err}") from err


def _check_parameters(fn: Callable, where: str) -> inspect.Signature:
    signature = inspect.signature(fn)
    variadic = [
        name
        for name, param in signature.parameters.items()
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if variadic:
        raise FunctionToolSchemaError(
            f"{where} declares variadic parameter(s) {variadic}, which an OpenAI tool schema cannot express; "
            "replace them with named parameters (e.g. `values: list[int]`)."
        )
    return signature


def _property(name: str, hint: Any, text: str, where: str) -> dict[str, Any]:
    try:
        prop = _type_schema(hint)
    except FunctionToolSchemaError as err:
        raise FunctionToolSchemaError(f"{where}, argument '{name}': {err}") from None
    choices = _CHOICES.search(text)
    if choices:
        try:
            prop["enum"] = json.loads(choices.group(1))
            text = text[: choices.start()].strip()
        except json.JSONDecodeError:
            pass  # not a JSON list: keep the words as description
    prop["description"] = text
    return prop


def infer_function_tool_schema(fn: Callable, tool_name: str) -> OpenAIFunctionToolSchema:
    """The OpenAI tool schema of ``fn`` under the name ``tool_name`` (rules in the module docstring)."""
    where = _where(fn, tool_name)
    signature = _check_parameters(fn, where)
    if not inspect.getdoc(fn):
        raise FunctionToolSchemaError(f"Cannot infer the schema of {where}: it has no docstring.")
    description, arg_texts = parse_google_docstring(inspect.getdoc(fn))
    hints = _type_hints(fn, where)
    properties, required = {}, []
    for name, param in signature.parameters.items():
        if name not in hints:
            raise FunctionToolSchemaError(f"Argument {name} is missing a type hint in {where}.")
        if name not in arg_texts:
            raise FunctionToolSchemaError(
                f"Cannot infer the schema of {where}: the docstring has no description for the argument '{name}' "
                "(add it to the `Args:` block)."
            )
        properties[name] = _property(name, hints[name], arg_texts[name], where)
        if param.default is inspect.Parameter.empty:
            required.append(name)
    parameters = {"type": "object", "properties": properties, "required": required}
    function = {"name": tool_name, "description": description, "parameters": parameters}
    return OpenAIFunctionToolSchema.model_validate({"type": "function", "function": function})
