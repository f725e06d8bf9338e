"""Tool-call parsers: the tool calls a model wrote in its sampled ids, under verl's registered names.

``ToolParser.get_tool_parser(name, tokenizer)`` gives the parser of ``rollout.multi_turn.format``:

* ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5 / Qwen3, Hermes);
* ``qwen3_coder``: the XML form ``<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>``
  (Qwen3-Coder / Qwen3.5), values converted by the tool's parameter types;
* ``kimi``: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}
  <|tool_call_end|>...<|tool_calls_section_end|>`` (Kimi K2);
* ``gpt-oss``: the harmony form ``<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json
  <|message|>{...}<|call|>``.

``await parser.extract_tool_calls(responses_ids, tools=None)`` decodes the ids and returns the text the model
wrote for the user (the calls taken out) and the calls, each a :class:`FunctionCall` with its arguments as a
JSON string. A call that cannot be read is skipped (logged), never raised.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import re
from abc import ABC, abstractmethod
from typing import Any

from pydantic import BaseModel

__all__ = [
    "FunctionCall",
    "GptOssToolParser",
    "HermesToolParser",
    "KimiToolParser",
    "Qwen3XMLToolParser",
    "ToolParser",
]

logger = logging.getLogger(__name__)


class FunctionCall(BaseModel):
    """One tool call the model wrote."""

    arguments: str
    """The call's arguments as the model gave them, a JSON string (not checked against the tool's schema)."""
    name: str
    """The name of the function called."""
    tool_call_id: str | None = None
    """The id the model gave the call, when its format has one (Kimi)."""


def _schema_of(tool: Any) -> dict[str, Any]:
    """A tool schema (pydantic ``OpenAIFunctionToolSchema`` or its dict) as a dict."""
    return tool.model_dump() if hasattr(tool, "model_dump") else dict(tool)


def _function_names(tools: list | None) -> list[str]:
    return [_schema_of(tool)["function"]["name"] for tool in tools or [] if _schema_of(tool).get("type") == "function"]


class ToolParser(ABC):
    """Reads the tool calls out of a model's sampled ids; subclasses register under a format name."""

    _registry: dict[str, type[ToolParser]] = {}

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @property
    def stop_token_ids(self) -> list[int]:
        """Ids that must stop generation so that the calls can run (none: the model's end-of-turn does)."""
        return []

    async def decode(self, responses_ids: list[int]) -> str:
        """The ids as text, special tokens kept, the pad token removed (off the event loop's thread)."""
        loop = asyncio.get_running_loop()
        text = await loop.run_in_executor(
            None, lambda: self.tokenizer.decode(list(responses_ids), skip_special_tokens=False)
        )
        pad = getattr(self.tokenizer, "pad_token", None)
        return text.replace(pad, "") if isinstance(pad, str) and pad else text

    @abstractmethod
    async def extract_tool_calls(
        self, responses_ids: list[int], tools: list | None = None
    ) -> tuple[str, list[FunctionCall]]:
        """The content (text without the calls) and the calls in ``responses_ids``; ``tools`` are the tool schemas
        offered to the model (some formats need their parameter types)."""
        raise NotImplementedError

    async def count_call_attempts(self, responses_ids: list[int]) -> int:
        """How many tool calls the model began in ``responses_ids``, readable or not (:meth:`extract_tool_calls`
        skips the unreadable ones; the loop counts each skipped one as a failed call). A format without a marker
        to count returns 0, and then only the readable calls count."""
        return 0

    @classmethod
    def get_tool_parser(cls, name: str, tokenizer: Any) -> ToolParser:
        """A parser of format ``name`` over ``tokenizer``.

        Raises:
            ValueError: no parser has that name; the message lists the registered ones.
        """
        if name not in cls._registry:
            raise ValueError(f"Unknown tool parser: {name!r}; registered tool parsers: {sorted(cls._registry)}")
        return cls._registry[name](tokenizer)

    @classmethod
    def register(cls, name: str):
        """Class decorator: make the parser known under ``name``."""

        def decorator(subclass: type[ToolParser]) -> type[ToolParser]:
            cls._registry[name] = subclass
            return subclass

        return decorator


@ToolParser.register("hermes")
class HermesToolParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number of them."""

    tool_call_start_token = "<tool_call>"
    tool_call_end_token = "</tool_call>"
    tool_call_regex = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    @staticmethod
    def _parse(body: str) -> FunctionCall | None:
        try:
            call = json.loads(body)
            name, arguments = call["name"], call["arguments"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            logger.warning("skipping an unreadable hermes tool call %r: %s", body, error)
            return None
        if not isinstance(name, str):
            logger.warning("skipping a hermes tool call whose name is not a string: %r", body)
            return None
        # arguments given as a string stay as written (the loop reports them if they are not a JSON object)
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return FunctionCall(name=name, arguments=text)

    async def extract_tool_calls(
        self, responses_ids: list[int], tools: list | None = None
    ) -> tuple[str, list[FunctionCall]]:
        text = await self.decode(responses_ids)
        if self.tool_call_start_token not in text or self.tool_call_end_token not in text:
            return text, []
        calls = [self._parse(body) for body in self.tool_call_regex.findall(text)]
        return self.tool_call_regex.sub("", text), [call for call in calls if call is not None]

    async def count_call_attempts(self, responses_ids: list[int]) -> int:
        return (await self.decode(responses_ids)).count(self.tool_call_start_token)


_INT_TYPES = ("int", "uint", "long", "short", "unsigned")
_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")


def convert_xml_parameter(value: str, param_type: str | None) -> Any:
    """A ``<parameter>`` value converted by its JSON-schema type (``None``: unknown, kept as text).

    ``null`` is None for every type; integers, numbers and booleans that do not read as such stay text (a
    boolean: false); objects and arrays are read as JSON, then as a Python literal (never evaluated), else text.
    """
    if value.lower() == "null":
        return None
    kind = (param_type or "string").strip().lower()
    if kind in _STRING_TYPES:
        return value
    if kind.startswith(_INT_TYPES):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    for reader in (json.loads, ast.literal_eval):
        try:
            return reader(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return value


@ToolParser.register("qwen3_coder")
class Qwen3XMLToolParser(ToolParser):
    """``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>`` (a last call
    cut before its closing tags still counts)."""

    tool_call_start_token = "<tool_call>"
    tool_call_prefix = "<function="
    tool_call_regex = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*?)$", re.DOTALL)
    function_regex = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.DOTALL)
    parameter_regex = re.compile(r"<parameter=(.*?)</parameter>|<parameter=(.*?)$", re.DOTALL)

    @staticmethod
    def _parameter_types(name: str, tools: list | None) -> dict[str, str | None]:
        for tool in tools or []:
            schema = _schema_of(tool)
            if schema.get("type") == "function" and schema["function"]["name"] == name:
                properties = (schema["function"].get("parameters") or {}).get("properties") or {}
                return {key: (prop or {}).get("type") for key, prop in properties.items()}
        return {}

    def _parse_xml_function_call(self, function_call_str: str, tools: list | None) -> FunctionCall | None:
        """One ``NAME>...parameters...`` body (what follows ``<function=``) as a call; None when the name's
        ``>`` is missing. A parameter without its ``>`` is skipped, the others kept."""
        end = function_call_str.find(">")
        if end < 0:
            logger.warning("skipping a qwen3_coder function call without '>': %r", function_call_str)
            return None
        name = function_call_str[:end].strip()
        types = self._parameter_types(name, tools)
        arguments: dict[str, Any] = {}
        for complete, partial in self.parameter_regex.findall(function_call_str[end + 1 :]):
            body = complete or partial
            split = body.find(">")
            if split < 0:
                logger.warning("skipping a parameter without '>' in the call of %s: %r", name, body)
                continue
            key, value = body[:split], body[split + 1 :]
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            arguments[key] = convert_xml_parameter(value, types.get(key, "string"))
        return FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))

    async def extract_tool_calls(
        self, responses_ids: list[int], tools: list | None = None
    ) -> tuple[str, list[FunctionCall]]:
        text = await self.decode(responses_ids)
        if self.tool_call_start_token not in text:
            return text, []
        bodies = [complete or partial for complete, partial in self.tool_call_regex.findall(text)]
        functions = [a or b for body in bodies for a, b in self.function_regex.findall(body)]
        calls = [self._parse_xml_function_call(function, tools) for function in functions]
        return text[: text.find(self.tool_call_start_token)], [call for call in calls if call is not None]


@ToolParser.register("kimi")
class KimiToolParser(ToolParser):
    """Kimi K2's special-token calls; each call's id (``functions.NAME:IDX``) is kept as ``tool_call_id``."""

    tool_calls_section_start_token = "<|tool_calls_section_begin|>"
    im_end_token = "<|im_end|>"
    tool_call_regex = re.compile(
        r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.DOTALL
    )

    @property
    def stop_token_ids(self) -> list[int]:
        """``<|im_end|>``, when the tokenizer has it."""
        token_id = self.tokenizer.convert_tokens_to_ids(self.im_end_token)
        unknown = getattr(self.tokenizer, "unk_token_id", None)
        return [token_id] if isinstance(token_id, int) and token_id >= 0 and token_id != unknown else []

    @staticmethod
    def _name(raw_id: str, tools: list | None) -> str:
        """The function name in a call id ``functions.NAME:IDX``; when tools are given and the name is not one of
        them, the one tool whose name the id contains (if exactly one)."""
        name = raw_id.split(":", 1)[0].removeprefix("functions.")
        names = _function_names(tools)
        if not names or name in names:
            return name
        contained = [candidate for candidate in names if candidate in raw_id]
        return contained[0] if len(contained) == 1 else name

    async def extract_tool_calls(
        self, responses_ids: list[int], tools: list | None = None
    ) -> tuple[str, list[FunctionCall]]:
        text = await self.decode(responses_ids)
        start = text.find(self.tool_calls_section_start_token)
        if start < 0:
            return text, []
        calls = []
        for raw_id, raw_arguments in self.tool_call_regex.findall(text):
            try:
                arguments = json.loads(raw_arguments.strip())
            except json.JSONDecodeError as error:
                logger.warning("skipping a kimi tool call with unreadable arguments %r: %s", raw_arguments, error)
                continue
            calls.append(
                FunctionCall(
                    name=self._name(raw_id.strip(), tools),
                    arguments=json.dumps(arguments, ensure_ascii=False),
                    tool_call_id=raw_id.strip(),
                )
            )
        return text[:start], calls


@ToolParser.register("gpt-oss")
class GptOssToolParser(ToolParser):
    """gpt-oss's harmony calls on the commentary channel; the analysis channel (its reasoning) is dropped first,
    as calls written there are not calls. The arguments are passed as written (checked by the loop)."""

    cot_pattern = re.compile(r"<\|start\|>assistant<\|channel\|>analysis<\|message\|>.*?<\|end\|>", re.DOTALL)
    # the prompt may already hold "<|start|>assistant", so the reasoning can also open at its channel tag
    partial_cot_pattern = re.compile(r"<\|channel\|>analysis<\|message\|>(.*?)<\|end\|>", re.DOTALL)
    # "<|start|>assistant" is absent from the first message of a turn (the prompt ends with it)
    tool_call_pattern = re.compile(
        r"(?:<\|start\|>assistant)?<\|channel\|>[^<]* to=functions\.([^<\s]+)\s*(?:<\|constrain\|>json)?"
        r"<\|message\|>(.*?)<\|call\|>",
        re.DOTALL,
    )

    async def extract_tool_calls(
        self, responses_ids: list[int], tools: list | None = None
    ) -> tuple[str, list[FunctionCall]]:
        text = await self.decode(responses_ids)
        text = self.partial_cot_pattern.sub("", self.cot_pattern.sub("", text))
        matches = self.tool_call_pattern.findall(text)
        if not matches:
            return text, []
        calls = [FunctionCall(name=name.strip(), arguments=arguments) for name, arguments in matches]
        return self.tool_call_pattern.sub("", text), calls
