"""The agent-loop surface under verl's names: what one loop returns, the base class a loop implements, the
server-manager contract it generates through, and the registry of loops by name.

An agent loop takes one dataset row (its ``raw_prompt`` messages and other fields as keyword arguments), talks
to the rollout engines token-in/token-out through a *server manager* (``generate(request_id, prompt_ids=...,
sampling_params=...) -> TokenOutput``) and to tools, and returns one :class:`AgentLoopOutput`: the prompt ids,
the response ids (model samples and tool turns), a mask that is 1 on the model's ids only, and their log-probs.

Loops register under a name (``@register("tool_agent")``), and more come from the YAML named by
``rollout.agent.agent_loop_config_path`` (a list of ``{name, _target_}``); :func:`get_agent_loop_class` and
:func:`instantiate_agent_loop` resolve a name. Nothing here imports Ray, hydra or PIL.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from verl.experimental.agent_loop.chat_tokens import ChatTokens
from verl.experimental.agent_loop.utils import resolve_config_path

__all__ = [
    "AgentLoopBase",
    "AgentLoopMetrics",
    "AgentLoopOutput",
    "DictConfigWrap",
    "ServerManager",
    "TokenOutput",
    "ToolListWrap",
    "config_value",
    "get_agent_loop_class",
    "get_trajectory_info",
    "instantiate_agent_loop",
    "load_agent_loop_config",
    "register",
]

logger = logging.getLogger(__name__)


class TokenOutput(BaseModel):
    """What a server manager returns for one generation: the sampled ids and what came with them."""

    token_ids: list[int]
    """The ids the model sampled (the response of this turn only)."""
    log_probs: list[float] | None = None
    """The sampling log-prob of each of ``token_ids`` (same length), when asked for."""
    routed_experts: Any | None = None
    """verl's recorded expert routing of a mixture-of-experts model (unused by the dense models here)."""
    stop_reason: str | None = None
    """Why generation stopped: ``'completed'``, ``'aborted'``, or None when unknown."""
    num_preempted: int | None = None
    """How many times the engine preempted the request, when it says."""
    extra_fields: dict[str, Any] = {}
    """Anything else the engine reports (e.g. ``global_steps`` of the weights that sampled)."""


@runtime_checkable
class ServerManager(Protocol):
    """The contract a loop generates through (verl's ``LLMServerClient.generate``): token ids in, token ids out.

    ``request_id`` is the same for every turn of one trajectory (a server may keep it on one engine).
    ``sampling_params`` is a plain dict (``temperature``, ``top_p``, ``top_k``, ``logprobs``, ``max_tokens``,
    ``stop_token_ids``...). ``image_data`` is always None here (multimodal rollouts are out of scope).
    """

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Any] | None = None,
    ) -> TokenOutput: ...


class AgentLoopMetrics(BaseModel):
    """Times (seconds) and counts of one loop run, as verl reports them per trajectory."""

    generate_sequences: float = 0.0
    """Seconds spent waiting on the server manager, summed over turns."""
    tool_calls: float = 0.0
    """Seconds spent running tools, summed over turns."""
    compute_score: float = 0.0
    """Seconds spent scoring (filled by whoever scores the output)."""
    num_preempted: int = -1
    """Engine preemptions summed over turns; -1 when the engine does not say."""


class AgentLoopOutput(BaseModel):
    """One trajectory of an agent loop (verl's fields)."""

    prompt_ids: list[int]
    """The prompt's ids (chat template applied, tool schemas included)."""
    response_ids: list[int]
    """The model's sampled ids and the ids of the tool / user turns between them, in order."""
    response_mask: list[int]
    """1 on ids the model sampled, 0 on tool / user / template ids; same length as ``response_ids``."""
    response_logprobs: list[float] | None = None
    """The sampling log-prob of each response id (0.0 on mask-0 ids); None when the engine gave none."""
    routed_experts: Any | None = None
    """verl's expert routing over the whole sequence (unused here)."""
    multi_modal_data: dict[str, Any] | None = None
    """verl's images / videos of the trajectory (always None here)."""
    reward_score: float | None = None
    """The trajectory's score, when the loop (or its caller) computed one."""
    num_turns: int = 0
    """Chat turns: the prompt's user turn, each assistant turn and each tool / user turn."""
    metrics: AgentLoopMetrics
    """Times and counts of the run."""
    extra_fields: dict[str, Any] = {}
    """Per-trajectory extras (``tool_rewards``, ``turn_scores``, tool-call counts...), one column each."""
    mm_processor_kwargs: dict[str, Any] | None = None
    """verl's multimodal processor options (always None here)."""

    def as_dict(self) -> dict[str, Any]:
        """verl's tensor form: ``prompts`` / ``responses`` / ``response_mask`` (int64), ``rollout_log_probs``
        (float32) when log-probs exist, ``rm_scores`` (the score on the last response position) when scored, the
        other set fields as they are, and ``extra_fields`` always (a teacher's ids / log-probs lifted out of it)."""
        import torch

        output = self.model_dump(exclude_unset=True)
        output["prompts"] = torch.tensor(output.pop("prompt_ids"), dtype=torch.int64)
        output["responses"] = torch.tensor(output.pop("response_ids"), dtype=torch.int64)
        output["response_mask"] = torch.tensor(output.pop("response_mask"), dtype=torch.int64)
        logprobs = output.pop("response_logprobs", None)
        if logprobs is not None:
            output["rollout_log_probs"] = torch.tensor(logprobs, dtype=torch.float32)
        reward_score = output.pop("reward_score", None)
        if reward_score is not None:
            rm_scores = torch.zeros_like(output["response_mask"], dtype=torch.float32)
            rm_scores[-1] = reward_score
            output["rm_scores"] = rm_scores
        # a default dict filled in place is not "set" for pydantic, so it is taken from the object
        extra_fields = output.setdefault("extra_fields", dict(self.extra_fields))
        for key in ("teacher_ids", "teacher_logprobs"):
            value = extra_fields.pop(key, None)
            if value is not None:
                output[key] = value
        return output


class DictConfigWrap:
    """A config carried whole to a loop's constructor (verl wraps it so that instantiation leaves it alone)."""

    def __init__(self, config: Any):
        self.config = config


class ToolListWrap:
    """The loaded tools carried whole to a loop's constructor (verl wraps them for the same reason)."""

    def __init__(self, tools: list):
        self.tools = tools


def config_value(section: Any, key: str, default: Any = None) -> Any:
    """``section.key`` of a DictConfig, mapping or dataclass config; ``default`` when the section or key is absent."""
    if section is None:
        return default
    if isinstance(section, Mapping):
        return section.get(key, default)
    return getattr(section, key, default)


def _unwrap(config: Any) -> Any:
    return config.config if isinstance(config, DictConfigWrap) else config


class AgentLoopBase(ABC):
    """A coroutine-based loop that turns one dataset row into one :class:`AgentLoopOutput`.

    Args:
        trainer_config: the whole trainer config (a :class:`DictConfigWrap`, or the config itself); the loop
            reads ``actor_rollout_ref.rollout`` (``prompt_length``, ``response_length``, ``multi_turn``...).
        server_manager: what the loop generates through (:class:`ServerManager`).
        tokenizer: a Hugging Face tokenizer with a chat template.
        processor: a multimodal processor; None here (multimodal rollouts are out of scope).
        dataset_cls: verl's dataset class (kept for loops that need it).
        data_config: the ``data`` config (wrapped or not): ``apply_chat_template_kwargs`` is read from it.
        hf_model_type: the model's ``model_type`` (kept for compatibility; the chat template alone is used here).
        **kwargs: constructor options other loops take (e.g. ``tools``), ignored by the base.
    """

    def __init__(
        self,
        trainer_config: DictConfigWrap | Any,
        server_manager: ServerManager,
        tokenizer: Any,
        processor: Any = None,
        dataset_cls: type | None = None,
        data_config: DictConfigWrap | Any = None,
        hf_model_type: str | None = None,
        **kwargs: Any,
    ):
        self.config = _unwrap(trainer_config)
        self.rollout_config = config_value(config_value(self.config, "actor_rollout_ref"), "rollout")
        if self.rollout_config is None:
            raise ValueError("the trainer config has no actor_rollout_ref.rollout section for the agent loop")
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        self.hf_model_type = hf_model_type
        self.data_config = _unwrap(data_config) if data_config is not None else {}
        self.apply_chat_template_kwargs = dict(config_value(self.data_config, "apply_chat_template_kwargs") or {})
        self.prompt_length = int(config_value(self.rollout_config, "prompt_length"))
        self.response_length = int(config_value(self.rollout_config, "response_length"))
        self.chat_tokens = ChatTokens(tokenizer, self.apply_chat_template_kwargs)

    @staticmethod
    def refuse_multi_modal(messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> None:
        """Raise when a row carries images, video or audio: multimodal rollouts are out of scope here."""
        has_media = bool(kwargs.get("multi_modal_data")) or any(
            isinstance(part, Mapping) and part.get("type") in ("image", "image_url", "video", "audio")
            for message in messages
            if isinstance(message.get("content"), list)
            for part in message["content"]
        )
        if has_media:
            raise NotImplementedError(
                "multimodal prompts (image / video / audio) are not supported by the agent loops here: "
                "rollouts are text-only. Remove the media from raw_prompt / multi_modal_data."
            )

    async def build_prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        """The prompt's ids (template, tool schemas, generation prompt), cut from the left to ``prompt_length``."""
        loop = asyncio.get_running_loop()
        prompt_ids = await loop.run_in_executor(None, self.chat_tokens.prompt_ids, messages, tools)
        if len(prompt_ids) > self.prompt_length:
            logger.warning(
                "Prompt of %d tokens exceeds rollout.prompt_length=%d; left-truncating.",
                len(prompt_ids),
                self.prompt_length,
            )
            prompt_ids = prompt_ids[-self.prompt_length :]
        return prompt_ids

    async def generate_turn(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        max_tokens: int,
        metrics: dict[str, Any],
    ) -> TokenOutput:
        """One generation through the server manager, ``max_tokens`` at most (the response budget left).

        Adds the wait to ``metrics['generate_sequences']`` and the engine's preemptions to
        ``metrics['num_preempted']`` (-1 until an engine reports one).

        Raises:
            ValueError: the engine returned log-probs whose count differs from its token count.
        """
        params = dict(sampling_params)
        params["max_tokens"] = min(int(params.get("max_tokens") or max_tokens), max_tokens)
        start = time.perf_counter()
        output = await self.server_manager.generate(
            request_id=request_id, prompt_ids=list(prompt_ids), sampling_params=params, image_data=None
        )
        metrics["generate_sequences"] = metrics.get("generate_sequences", 0.0) + time.perf_counter() - start
        if output.num_preempted is not None:
            metrics["num_preempted"] = max(metrics.get("num_preempted", -1), 0) + output.num_preempted
        if output.log_probs is not None and len(output.log_probs) != len(output.token_ids):
            raise ValueError(
                f"the server manager returned {len(output.log_probs)} log-probs for {len(output.token_ids)} tokens"
            )
        return output

    @abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Run the loop on one row.

        Args:
            sampling_params: the engine's sampling options (a dict, passed to the server manager).
            **kwargs: the row's fields; ``raw_prompt`` (the chat messages) at least.
        """
        raise NotImplementedError


_agent_loop_registry: dict[str, dict[str, Any]] = {}
"""Agent loops by name: ``{"_target_": "<module>.<Class>", **constructor options}`` (verl's form)."""


def register(agent_name: str):
    """Class decorator: make the loop class known under ``agent_name``."""

    def decorator(subclass: type[AgentLoopBase]) -> type[AgentLoopBase]:
        _agent_loop_registry[agent_name] = {"_target_": f"{subclass.__module__}.{subclass.__qualname__}"}
        return subclass

    return decorator


def load_agent_loop_config(agent_loop_config_path: str) -> list[str]:
    """Register the loops listed in the YAML of ``rollout.agent.agent_loop_config_path``; returns their names.

    The file is a list of ``{name: ..., _target_: <module>.<Class>, ...}``; keys other than ``name`` and
    ``_target_`` are constructor options of that loop. A later entry of the same name replaces the earlier one.

    Raises:
        FileNotFoundError: the file is not found (see :func:`resolve_config_path`).
        ValueError: the file is not such a list, or an entry lacks ``name`` or ``_target_``.
    """
    from omegaconf import OmegaConf

    path = resolve_config_path(agent_loop_config_path)
    entries = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(entries, list):
        raise ValueError(f"{path}: an agent loop config is a list of {{name, _target_}}, got {type(entries).__name__}")
    names = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("_target_"):
            raise ValueError(f"{path}: entry {index} needs a `name` and a `_target_` (module.Class), got {entry!r}")
        options = {key: value for key, value in entry.items() if key != "name"}
        _agent_loop_registry[str(entry["name"])] = options
        names.append(str(entry["name"]))
    return names


def _import_target(target: str) -> Any:
    """The object a dotted ``module.Class`` (or ``module.Outer.Inner``) path names."""
    parts = target.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"cannot import the agent loop target {target!r}")


def get_agent_loop_class(agent_name: str) -> type[AgentLoopBase]:
    """The loop class registered under ``agent_name``.

    Raises:
        ValueError: no loop has that name; the message lists the registered names.
        TypeError: the ``_target_`` is not an :class:`AgentLoopBase` subclass.
    """
    # the built-in loops register when the package is imported
    importlib.import_module("verl.experimental.agent_loop")
    if agent_name not in _agent_loop_registry:
        raise ValueError(
            f"Agent loop {agent_name!r} is not registered; registered agent loops: "
            f"{sorted(_agent_loop_registry)}. Register a class with @register(name) or list it in "
            "rollout.agent.agent_loop_config_path."
        )
    target = _agent_loop_registry[agent_name]["_target_"]
    cls = _import_target(target)
    if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
        raise TypeError(f"agent loop {agent_name!r}: {target} is not an AgentLoopBase subclass")
    return cls


def instantiate_agent_loop(agent_name: str, **kwargs: Any) -> AgentLoopBase:
    """A new loop of the class named ``agent_name``: its registry options, then ``kwargs`` (which win)."""
    cls = get_agent_loop_class(agent_name)
    options = {key: value for key, value in _agent_loop_registry[agent_name].items() if key != "_target_"}
    return cls(**{**options, **kwargs})


async def get_trajectory_info(step: int, index: list, validate: bool) -> list[dict[str, Any]]:
    """verl's trace labels of a batch: per row its ``step``, ``sample_index`` (``index[i]``), ``rollout_n`` (its
    place among adjacent rows of the same index) and ``validate``."""
    info, rollout_n = [], 0
    for i, sample_index in enumerate(index):
        rollout_n = rollout_n + 1 if i > 0 and index[i - 1] == sample_index else 0
        info.append({"step": step, "sample_index": sample_index, "rollout_n": rollout_n, "validate": validate})
    return info
