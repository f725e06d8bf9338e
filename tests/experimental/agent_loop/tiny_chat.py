"""Test doubles of the agent-loop tests: a character-level chat tokenizer built in memory, a scripted server
manager, a trainer config, and tools.

The tokenizer maps each printable ASCII character (and ``\\n``) to one id, with one merge, ``ab``, so that the ids
``[a, b]`` decode to ``"ab"`` which encodes back to the single merged id: decode then encode is *not* the
identity on ids, as with real BPE tokenizers. Chat markers (``<|im_start|>``, ``<tool_call>``...) are single
special ids. Its ChatML-like template renders tools, tool calls and ``role: tool`` messages the way Qwen's does.
"""

from __future__ import annotations

import asyncio
from typing import Any

from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    TokenOutput,
)
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

SPECIAL_TOKENS = [
    "<pad>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|call|>",
    "<|end|>",
]

CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system{{ '\\n' }}Tools:"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}<|im_end|>{{ '\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>{{ '\\n' }}{{ message.content }}{{ '\\n' }}</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>{{ '\\n' }}{% endif %}"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant{{ '\\n' }}{{ message.content }}"
    "{% for call in message.tool_calls or [] %}<tool_call>"
    '{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}</tool_call>'
    "{% endfor %}<|im_end|>{{ '\\n' }}"
    "{% else %}<|im_start|>{{ message.role }}{{ '\\n' }}{{ message.content }}<|im_end|>{{ '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}"
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer with the ``ab`` merge (see the module docstring)."""
    chars = [chr(code) for code in range(32, 127)] + ["\n"]
    vocab = {char: index for index, char in enumerate(chars)}
    vocab["ab"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<|im_end|>")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def trainer_config(response_length: int = 400, prompt_length: int = 1024, **multi_turn: Any) -> DictConfigWrap:
    """A trainer config with the rollout keys the loops read; ``multi_turn`` overrides verl's defaults."""
    turns = {
        "max_assistant_turns": None,
        "max_user_turns": None,
        "max_parallel_calls": 1,
        "max_tool_response_length": 256,
        "tool_response_truncate_side": "middle",
        "format": "hermes",
        "tool_config_path": None,
    }
    turns.update(multi_turn)
    rollout = {"prompt_length": prompt_length, "response_length": response_length, "multi_turn": turns}
    return DictConfigWrap(OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}, "data": {}}))


class ScriptedServer:
    """A server manager that answers each ``generate`` with the next scripted sample.

    A sample is a text (encoded with the tokenizer) or a list of ids; its log-probs are -0.01, -0.02, ... per
    call (call k's i-th id: -(k + 1) / 100 - i / 10000) so that each id's log-prob is traceable.
    """

    def __init__(self, tokenizer: Any, samples: list[str | list[int]], logprobs: bool = True):
        self.tokenizer = tokenizer
        self.samples = list(samples)
        self.logprobs = logprobs
        self.calls: list[dict[str, Any]] = []

    @staticmethod
    def logprob(call: int, position: int) -> float:
        return -(call + 1) / 100 - position / 10000

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None) -> TokenOutput:
        call = len(self.calls)
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "params": dict(sampling_params)})
        sample = self.samples[call]
        ids = self.tokenizer.encode(sample, add_special_tokens=False) if isinstance(sample, str) else list(sample)
        ids = ids[: sampling_params.get("max_tokens", len(ids))]
        logprobs = [self.logprob(call, i) for i in range(len(ids))] if self.logprobs else None
        return TokenOutput(token_ids=ids, log_probs=logprobs, num_preempted=0, extra_fields={"global_steps": call})


def tool_schema(name: str, properties: dict[str, str] | None = None) -> OpenAIFunctionToolSchema:
    """A function schema named ``name`` with ``properties`` (name -> JSON type)."""
    props = {key: {"type": kind} for key, kind in (properties or {}).items()}
    return OpenAIFunctionToolSchema.model_validate(
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"the {name} tool",
                "parameters": {"type": "object", "properties": props, "required": list(props)},
            },
        }
    )


class AddTool(BaseTool):
    """``add(a, b)`` -> the sum as text, reward 1.0; records its created / released instances."""

    def __init__(self, name: str = "add"):
        super().__init__({}, tool_schema(name, {"a": "integer", "b": "integer"}))
        self.created: list[dict] = []
        self.released: list[str] = []

    async def create(self, instance_id=None, **kwargs):
        self.created.append(kwargs)
        return f"{self.name}-{len(self.created)}", ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=str(parameters["a"] + parameters["b"])), 1.0, {}

    async def release(self, instance_id, **kwargs):
        self.released.append(instance_id)


class FailingTool(AddTool):
    """Raises in ``execute`` (its instance is still released)."""

    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("database connection failed")


class HangingTool(AddTool):
    """Never answers (until cancelled)."""

    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.Event().wait()


class TextTool(AddTool):
    """Answers with a fixed text."""

    def __init__(self, name: str, text: str):
        super().__init__(name)
        self.text = text

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=self.text), 0.5, {}


class ImageTool(AddTool):
    """Answers with an image (which the loop refuses)."""

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="see", image=["an image"]), 0.0, {}


class MeetingTool(AddTool):
    """Answers only once ``expected`` calls of it are running at once: each waits (up to 5 s, a bound that only a
    call that can never meet the others reaches) for the others to arrive."""

    def __init__(self, name: str, meeting: dict[str, Any], expected: int):
        super().__init__(name)
        self.meeting, self.expected = meeting, expected

    async def execute(self, instance_id, parameters, **kwargs):
        self.meeting["arrived"] = self.meeting.get("arrived", 0) + 1
        self.meeting["peak"] = max(self.meeting.get("peak", 0), self.meeting["arrived"])
        event = self.meeting.setdefault("event", asyncio.Event())
        if self.meeting["arrived"] >= self.expected:
            event.set()
        await asyncio.wait_for(event.wait(), 5.0)
        return ToolResponse(text="met"), 0.0, {}


class EchoAgentLoop(AgentLoopBase):
    """A loop listed by the config-path tests: answers with its prompt, keeps its ``greeting`` option."""

    def __init__(self, *args: Any, greeting: str = "", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.greeting = greeting

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt_ids = await self.build_prompt_ids(list(kwargs["raw_prompt"]))
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=[], response_mask=[], metrics=AgentLoopMetrics())


def make_loop(cls: type, samples: list, *, logprobs: bool = True, loop_kwargs: dict | None = None, **config: Any):
    """A loop of class ``cls`` over the tiny tokenizer and a :class:`ScriptedServer` of ``samples``;
    ``loop_kwargs`` go to the loop's constructor (``tools``, ``tool_call_timeout``), ``config`` to
    :func:`trainer_config`. Returns (loop, server)."""
    tokenizer = tiny_tokenizer()
    server = ScriptedServer(tokenizer, samples, logprobs=logprobs)
    wrap = trainer_config(**config)
    loop = cls(
        trainer_config=wrap,
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(wrap.config.data),
        **(loop_kwargs or {}),
    )
    return loop, server
