"""verl's ``tool_agent``: a ReAct loop of generations and tool calls, token-in/token-out.

Each turn the model samples (through the server manager) from the prompt and everything appended so far; the
configured parser (``rollout.multi_turn.format``) reads the tool calls out of the sampled ids; up to
``max_parallel_calls`` of them run at once through the tools' ``create`` / ``execute`` / ``release`` API (a plain
function tool through its ``call``); their results go back as ``role: tool`` messages, rendered by the chat
template and appended as ids. The response is exactly the ids the model sampled (mask 1, their log-probs) and the
ids of the tool turns (mask 0, log-prob 0.0).

It stops when a generation has no tool call, when ``max_assistant_turns`` or ``max_user_turns`` is reached, or
when the ``rollout.response_length`` budget is used (a tool turn that would not fit is dropped; a last sample is
cut at the budget). A tool that is unknown, gets arguments that are not a JSON object, raises, or outruns
``tool_call_timeout`` answers with an error message as its tool response; the run goes on and the error is
counted. A tool response with images or video is refused (multimodal rollouts are out of scope).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from enum import Enum
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    TokenOutput,
    ToolListWrap,
    config_value,
    register,
)
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.experimental.agent_loop.utils import build_gpt_oss_tool_response_text, resolve_config_path
from verl.tools.schemas import ToolResponse

__all__ = ["AgentData", "AgentState", "ToolAgentLoop", "truncate_tool_response"]

logger = logging.getLogger(__name__)

TRUNCATE_SIDES = ("left", "right", "middle")
# the key of a _call_tool result's info dict that marks a failed call, valued by the kind of failure
TOOL_CALL_ERROR_KEY = "tool_call_error"


class AgentState(Enum):
    """Where the loop is: verl's states."""

    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    TERMINATED = "terminated"


class AgentData:
    """The state of one trajectory, handed to tools (``execute(..., agent_data=...)``) so they may read it.

    ``prompt_ids`` is the prompt alone; ``response_ids`` / ``response_mask`` / ``response_logprobs`` grow turn by
    turn, always of one length. ``extra_fields`` holds what the engine reported and whatever tools add.
    """

    def __init__(self, messages: list[dict[str, Any]], request_id: str, tools_kwargs: dict[str, Any]):
        self.messages = messages
        self.request_id = request_id
        self.tools_kwargs = tools_kwargs
        self.metrics: dict[str, Any] = {}
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.response_logprobs: list[float] = []
        self.has_logprobs = False
        self.last_generated_ids: list[int] = []
        self.turn_scores: list[float] = []
        self.tool_rewards: list[float] = []
        self.user_turns = 0
        self.assistant_turns = 0
        self.num_tool_calls = 0
        self.num_tool_call_errors = 0
        self.termination_reason = ""
        self.tool_calls: list[FunctionCall] = []
        self.active_tools: dict[str, Any] = {}
        self.active_tool_schemas: list[dict[str, Any]] = []
        self.extra_fields: dict[str, Any] = {}

    def append(self, ids: list[int], mask: int, logprobs: list[float] | None = None) -> None:
        """Append ``ids`` with mask ``mask`` and their log-probs (0.0 each when None)."""
        self.response_ids.extend(ids)
        self.response_mask.extend([mask] * len(ids))
        self.response_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.has_logprobs = self.has_logprobs or logprobs is not None


def truncate_tool_response(text: str, max_length: int, side: str) -> str:
    """``text`` cut to ``max_length`` characters (verl's marks added): ``left`` keeps the end, ``right`` the start,
    ``middle`` half of each."""
    if len(text) <= max_length:
        return text
    if side == "left":
        return "(truncated)..." + text[len(text) - max_length :]
    if side == "right":
        return text[:max_length] + "...(truncated)"
    half = max_length // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half :]


def _tool_error(message: str, kind: str) -> tuple[ToolResponse, float, dict]:
    logger.warning(message)
    return ToolResponse(text=message), 0.0, {TOOL_CALL_ERROR_KEY: kind}


def _is_function_tool(tool: Any) -> bool:
    """A plain function tool (``await tool.call(args)``), as opposed to a stateful ``BaseTool``."""
    return callable(getattr(tool, "call", None)) and not callable(getattr(tool, "execute", None))


async def _execute_tool(
    tool: Any, name: str, arguments: dict, tools_kwargs: dict[str, Any], agent_data: AgentData
) -> tuple[Any, float, dict]:
    """A function tool's ``call``, or a ``BaseTool``'s create / execute / release (released even on failure, with
    ``tools_kwargs[name]['create_kwargs']`` for create)."""
    if _is_function_tool(tool):
        from verl.tools.function_tool import normalize_function_tool_return

        return normalize_function_tool_return(await tool.call(arguments))
    create_kwargs = (tools_kwargs.get(name) or {}).get("create_kwargs") or {}
    instance_id, _ = await tool.create(create_kwargs=create_kwargs)
    try:
        return await tool.execute(instance_id, arguments, agent_data=agent_data)
    finally:
        try:
            await tool.release(instance_id)
        except Exception as error:  # a failed release must not hide the call's result
            logger.warning("releasing tool %s instance %s failed: %s", name, instance_id, error)


def _load_tools(multi_turn: Any) -> list:
    """The tools of ``multi_turn.tool_config_path`` / ``function_tool_path`` (none when neither is set)."""
    tool_config_path = config_value(multi_turn, "tool_config_path")
    function_tool_path = config_value(multi_turn, "function_tool_path")
    if not tool_config_path and not function_tool_path:
        return []
    from verl.tools.tool_registry import load_all_tools

    return load_all_tools(
        tool_config_path=resolve_config_path(tool_config_path) if tool_config_path else None,
        function_tool_path=resolve_config_path(function_tool_path) if function_tool_path else None,
    )


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """The ReAct tool loop (see the module docstring).

    Args:
        tools: the tools (a :class:`ToolListWrap` or a list of ``BaseTool`` / function tools); None: loaded from
            ``rollout.multi_turn.tool_config_path`` (and ``function_tool_path``).
        tool_call_timeout: seconds one call (create + execute + release) may take; None: no limit.
        *args, **kwargs: :class:`AgentLoopBase`'s.
    """

    def __init__(
        self, *args: Any, tools: ToolListWrap | list | None = None, tool_call_timeout: float | None = None, **kwargs
    ):
        super().__init__(*args, **kwargs)
        multi_turn = config_value(self.rollout_config, "multi_turn")
        self.max_user_turns = config_value(multi_turn, "max_user_turns")
        self.max_assistant_turns = config_value(multi_turn, "max_assistant_turns")
        self.max_parallel_calls = int(config_value(multi_turn, "max_parallel_calls") or 1)
        self.max_tool_response_length = int(config_value(multi_turn, "max_tool_response_length") or 256)
        self.tool_response_truncate_side = config_value(multi_turn, "tool_response_truncate_side") or "middle"
        if self.tool_response_truncate_side not in TRUNCATE_SIDES:
            raise ValueError(
                f"multi_turn.tool_response_truncate_side={self.tool_response_truncate_side!r}: "
                f"use one of {TRUNCATE_SIDES}"
            )
        self.tool_parser_name = config_value(multi_turn, "format") or "hermes"
        self.tool_parser = ToolParser.get_tool_parser(self.tool_parser_name, self.tokenizer)
        self.tool_call_timeout = tool_call_timeout
        tool_list = tools.tools if isinstance(tools, ToolListWrap) else tools
        tool_list = _load_tools(multi_turn) if tool_list is None else list(tool_list)
        self.tools = {tool.name: tool for tool in tool_list}
        self.tool_schemas = [self._schema(tool) for tool in tool_list]

    @staticmethod
    def _schema(tool: Any) -> dict[str, Any]:
        return tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)

    def _select_tools(self, agent_data: AgentData, extra_info: Any) -> None:
        """The row's tools: those named in ``extra_info['tool_selection']`` (verl's per-row choice), else all."""
        selection = extra_info.get("tool_selection") if isinstance(extra_info, dict) else None
        if selection:
            agent_data.active_tools = {name: self.tools[name] for name in selection if name in self.tools}
        else:
            agent_data.active_tools = dict(self.tools)
        agent_data.active_tool_schemas = [self._schema(tool) for tool in agent_data.active_tools.values()]

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Run on one row. Reads ``raw_prompt`` (the chat messages), ``tools_kwargs`` (per tool name:
        ``{"create_kwargs": {...}}`` for its ``create``) and ``extra_info`` (``tool_selection``); other fields
        are not read."""
        messages = list(kwargs["raw_prompt"])
        self.refuse_multi_modal(messages, kwargs)
        agent_data = AgentData(messages, uuid4().hex, dict(kwargs.get("tools_kwargs") or {}))
        self._select_tools(agent_data, kwargs.get("extra_info") or {})
        state = AgentState.PENDING
        while state != AgentState.TERMINATED:
            if state == AgentState.PENDING:
                state = await self._handle_pending_state(agent_data, sampling_params)
            elif state == AgentState.GENERATING:
                state = await self._handle_generating_state(agent_data, sampling_params)
            else:
                state = await self._handle_processing_tools_state(agent_data)
        return self._finish(agent_data)

    async def _handle_pending_state(self, agent_data: AgentData, sampling_params: dict[str, Any]) -> AgentState:
        """The prompt's ids, with the row's tool schemas."""
        agent_data.prompt_ids = await self.build_prompt_ids(agent_data.messages, tools=agent_data.active_tool_schemas)
        return AgentState.GENERATING

    def _stop_reason(self, agent_data: AgentData) -> str:
        """Why the loop must stop after a generation ('' when it may go on)."""
        if len(agent_data.response_ids) >= self.response_length:
            return "response_length"
        if self.max_assistant_turns and agent_data.assistant_turns >= self.max_assistant_turns:
            return "max_assistant_turns"
        if self.max_user_turns and agent_data.user_turns >= self.max_user_turns:
            return "max_user_turns"
        return ""

    def _merge_extra_fields(self, agent_data: AgentData, output: TokenOutput) -> None:
        """The engine's extras: the first turn's, with the latest ``max_global_steps`` of later turns."""
        if not agent_data.extra_fields:
            agent_data.extra_fields.update(output.extra_fields)
        elif output.extra_fields.get("max_global_steps") is not None:
            agent_data.extra_fields["max_global_steps"] = output.extra_fields["max_global_steps"]

    async def _handle_generating_state(self, agent_data: AgentData, sampling_params: dict[str, Any]) -> AgentState:
        """One sample, appended as sampled; then its tool calls, unless a limit is reached or there are none."""
        remaining = self.response_length - len(agent_data.response_ids)
        if remaining <= 0:
            agent_data.termination_reason = "response_length"
            return AgentState.TERMINATED
        if self.tool_parser.stop_token_ids:
            stops = set(sampling_params.get("stop_token_ids") or []) | set(self.tool_parser.stop_token_ids)
            sampling_params = {**sampling_params, "stop_token_ids": sorted(stops)}
        prompt = agent_data.prompt_ids + agent_data.response_ids
        output = await self.generate_turn(agent_data.request_id, prompt, sampling_params, remaining, agent_data.metrics)
        self._merge_extra_fields(agent_data, output)
        agent_data.last_generated_ids = list(output.token_ids)
        agent_data.append(agent_data.last_generated_ids, 1, output.log_probs)
        agent_data.assistant_turns += 1
        agent_data.termination_reason = self._stop_reason(agent_data)
        if agent_data.termination_reason:
            return AgentState.TERMINATED
        schemas = [tool.tool_schema for tool in agent_data.active_tools.values()]
        content, agent_data.tool_calls = await self.tool_parser.extract_tool_calls(output.token_ids, schemas)
        # a call the parser could not read runs nothing: counted as a call that failed
        unreadable = max(0, await self.tool_parser.count_call_attempts(output.token_ids) - len(agent_data.tool_calls))
        agent_data.num_tool_calls += unreadable
        agent_data.num_tool_call_errors += unreadable
        agent_data.messages.append(self._build_assistant_message(content, agent_data))
        if not agent_data.tool_calls:
            agent_data.termination_reason = "no_tool_call"
            return AgentState.TERMINATED
        return AgentState.PROCESSING_TOOLS

    def _tool_message(self, call: FunctionCall, response: ToolResponse) -> dict[str, Any]:
        """The ``role: tool`` message of one call's response.

        Raises:
            NotImplementedError: the response holds images or video.
        """
        if response.image or response.video:
            raise NotImplementedError(
                f"tool {call.name!r} returned images/video: multimodal tool responses are not supported by the "
                "agent loops here (rollouts are text-only). Return text from the tool."
            )
        message: dict[str, Any] = {"role": "tool", "content": response.text or ""}
        if call.tool_call_id is not None:
            message["tool_call_id"] = call.tool_call_id
        return message

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        """Run the calls at once, then append their responses as one tool turn (mask 0) if it fits the budget."""
        calls = agent_data.tool_calls[: self.max_parallel_calls]
        start = time.perf_counter()
        results = await asyncio.gather(*(self._call_tool(call, agent_data.tools_kwargs, agent_data) for call in calls))
        agent_data.metrics["tool_calls"] = agent_data.metrics.get("tool_calls", 0.0) + time.perf_counter() - start
        messages = []
        for call, (response, reward, info) in zip(calls, results, strict=True):
            messages.append(self._tool_message(call, response))
            agent_data.num_tool_calls += 1
            agent_data.num_tool_call_errors += int(TOOL_CALL_ERROR_KEY in (info or {}))
            if reward is not None:
                agent_data.tool_rewards.append(reward)
        ids = await self._tool_turn_ids(messages, [call.name for call in calls], agent_data)
        if len(agent_data.response_ids) + len(ids) >= self.response_length:
            agent_data.termination_reason = "response_length"
            return AgentState.TERMINATED
        agent_data.messages.extend(messages)
        agent_data.append(ids, 0)
        agent_data.user_turns += 1
        return AgentState.GENERATING

    async def _tool_turn_ids(self, messages: list[dict], names: list[str], agent_data: AgentData) -> list[int]:
        """The ids of a tool turn after the model's last sample (gpt-oss's written by hand, as verl does)."""
        if self.tool_parser_name == "gpt-oss":
            return self.chat_tokens.encode(build_gpt_oss_tool_response_text(messages, names))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None,
            lambda: self.chat_tokens.appended_ids(
                messages, tools=agent_data.active_tool_schemas, generated_ids=agent_data.last_generated_ids
            ),
        )

    def _build_assistant_message(self, content: str, agent_data: AgentData) -> dict[str, Any]:
        """The assistant message of the history (bookkeeping only: its ids are the sampled ones)."""
        message: dict[str, Any] = {"role": "assistant", "content": content or ""}
        tool_calls = []
        for call in agent_data.tool_calls[: self.max_parallel_calls]:
            try:
                arguments = json.loads(call.arguments)
            except (json.JSONDecodeError, TypeError):
                arguments = call.arguments
            entry: dict[str, Any] = {"type": "function", "function": {"name": call.name, "arguments": arguments}}
            if call.tool_call_id is not None:
                entry["id"] = call.tool_call_id
            tool_calls.append(entry)
        if tool_calls:
            message["tool_calls"] = tool_calls
        return message

    async def _call_tool(
        self, tool_call: FunctionCall, tools_kwargs: dict[str, Any], agent_data: AgentData
    ) -> tuple[ToolResponse, float, dict]:
        """One call: (response, step reward, info). Every failure is a response that says what went wrong, with
        reward 0.0 and ``info['tool_call_error']`` its kind: ``unknown_tool``, ``invalid_arguments``, ``timeout``,
        ``exception``."""
        tools = getattr(agent_data, "active_tools", self.tools)
        name = tool_call.name
        if name not in tools:
            return _tool_error(f"Unknown function '{name}'. Available tools: {list(tools)}", "unknown_tool")
        try:
            arguments = json.loads(tool_call.arguments)
        except (json.JSONDecodeError, TypeError) as error:
            return _tool_error(f"Invalid JSON in arguments for '{name}': {error}", "invalid_arguments")
        if not isinstance(arguments, dict):
            message = f"Invalid arguments for '{name}': expected a JSON object, got {type(arguments).__name__}"
            return _tool_error(message, "invalid_arguments")
        timeout = getattr(self, "tool_call_timeout", None)
        timeout = timeout if isinstance(timeout, int | float) and not isinstance(timeout, bool) else None
        try:
            call = _execute_tool(tools[name], name, arguments, tools_kwargs, agent_data)
            response, reward, info = await asyncio.wait_for(call, timeout)
        except asyncio.TimeoutError as error:
            if timeout is None:  # raised by the tool itself
                return _tool_error(f"Error executing tool '{name}': {error!r}", "exception")
            return _tool_error(f"Tool '{name}' timed out after {timeout} seconds", "timeout")
        except Exception as error:  # a tool's failure is the model's feedback, not the run's end
            return _tool_error(f"Error executing tool '{name}': {error}", "exception")
        if not isinstance(response, ToolResponse):
            response = ToolResponse(text=str(response))
        text = truncate_tool_response(
            response.text or "", self.max_tool_response_length, self.tool_response_truncate_side
        )
        return ToolResponse(text=text, image=response.image, video=response.video), reward, info or {}

    def _finish(self, agent_data: AgentData) -> AgentLoopOutput:
        """The output: the response cut to ``response_length`` (mask and log-probs alike) and the counts."""
        length = self.response_length
        agent_data.extra_fields.update(
            {
                "turn_scores": agent_data.turn_scores,
                "tool_rewards": agent_data.tool_rewards,
                "num_tool_calls": agent_data.num_tool_calls,
                "num_tool_call_errors": agent_data.num_tool_call_errors,
                "num_assistant_turns": agent_data.assistant_turns,
                "num_user_turns": agent_data.user_turns,
                "termination_reason": agent_data.termination_reason,
            }
        )
        return AgentLoopOutput(
            prompt_ids=agent_data.prompt_ids,
            response_ids=agent_data.response_ids[:length],
            response_mask=agent_data.response_mask[:length],
            response_logprobs=agent_data.response_logprobs[:length] if agent_data.has_logprobs else None,
            num_turns=agent_data.user_turns + agent_data.assistant_turns + 1,
            metrics=AgentLoopMetrics(**agent_data.metrics),
            extra_fields=agent_data.extra_fields,
        )
