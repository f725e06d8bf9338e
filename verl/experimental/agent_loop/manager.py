"""verl's ``AgentLoopManager`` here: one agent loop per prompt row (times ``rollout.n``), run on the rollout engines
of a worker group, and the trainer's batch of their trajectories.

verl starts ``rollout.agent.num_workers`` agent-loop processes, each running the loops of its share of the batch
at once on asyncio, against rollout servers. Here the loops run on the driver's asyncio event loop (tools that
block should be ``async``), in ``num_workers`` groups of rows as verl splits them, all of them in flight at once
as in verl; their generations go to the worker group through :class:`~verl.experimental.agent_loop.server.
WorkerGroupServer`, which batches the requests of the trajectories in flight into one call spread over the
data-parallel ranks, while the trajectories in tool calls run their tools.

Each row's loop is the one its ``agent_name`` column names, else ``rollout.agent.default_agent_loop``; it gets the
row's non-tensor fields as keyword arguments (verl's): ``raw_prompt`` as the chat messages (the row's
``raw_chat``, or its plain prompt as one user message), ``tools_kwargs`` (the column, else ``extra_info
.tools_kwargs``), ``extra_info``, ``index``, ``uid`` and the rest. The rows are repeated ``n`` times interleaved
(``[a, a, b, b]``), their fields with them, as every rollout repeats them, so a group shares its ``uid``.

The batch is laid out as every rollout's (:mod:`verl.experimental.agent_loop.batch`), with the input rows'
non-tensor fields, ``meta_info["temperature"]`` (what the loops sampled at, which the old log-probs use) and the
agent-loop metrics verl logs (:func:`agent_loop_metrics`) in ``meta_info["agent_loop_metrics"]``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    config_value,
    instantiate_agent_loop,
    load_agent_loop_config,
)
from verl.experimental.agent_loop.batch import assemble_batch
from verl.experimental.agent_loop.server import WorkerGroupServer
from verl.protocol import DataProto

__all__ = ["AgentLoopManager", "agent_loop_metrics", "loop_kwargs", "sampling_params_for"]


def sampling_params_for(rollout: Any, meta_info: Mapping[str, Any]) -> dict[str, Any]:
    """verl's sampling options of the loops: the rollout's ``temperature``, ``top_p``, ``top_k``, with the batch's
    per-call overrides (validation's ``val_kwargs``); ``do_sample`` false is greedy (temperature 0)."""
    params = {
        "temperature": float(meta_info.get("temperature", rollout.temperature)),
        "top_p": float(meta_info.get("top_p", rollout.top_p)),
        "top_k": int(meta_info.get("top_k", rollout.top_k)),
        "repetition_penalty": 1.0,
        "logprobs": bool(rollout.calculate_log_probs),
    }
    if not bool(meta_info.get("do_sample", rollout.do_sample)):
        params.update(temperature=0.0, top_p=1.0, top_k=-1)
    return params


def _plain(value: Any) -> Any:
    """A non-tensor cell as plain Python (numpy scalars and arrays unwrapped)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def loop_kwargs(non_tensors: Mapping[str, np.ndarray], row: int) -> dict[str, Any]:
    """The keyword arguments of one row's loop (see the module); ``agent_name`` is left in for the caller."""
    kwargs = {key: _plain(values[row]) for key, values in non_tensors.items()}
    chat = kwargs.get("raw_chat")
    if not chat:
        prompt = kwargs.get("raw_prompt")
        chat = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    kwargs["raw_prompt"] = [dict(message) for message in chat]
    if kwargs.get("tools_kwargs") is None:
        extra_info = kwargs.get("extra_info") if isinstance(kwargs.get("extra_info"), dict) else {}
        kwargs["tools_kwargs"] = dict(extra_info.get("tools_kwargs") or {})
    return kwargs


def _stats(name: str, values: np.ndarray) -> dict[str, float]:
    return {
        f"{name}/min": float(values.min()),
        f"{name}/max": float(values.max()),
        f"{name}/mean": float(values.mean()),
    }


def agent_loop_metrics(outputs: list[AgentLoopOutput], attention_mask: Any, prompt_length: int) -> dict[str, float]:
    """verl's agent-loop metrics of a batch: per-trajectory seconds generating (``agent_loop/generate_sequences``),
    in tools (``agent_loop/tool_calls``) and scoring (``agent_loop/compute_score``), engine preemptions
    (``agent_loop/num_preempted``), each ``/min``, ``/max``, ``/mean``; the slowest trajectory's
    (``agent_loop/slowest/*``, with its prompt and response lengths); and, from the loops' extra fields, the tool
    calls made and failed (``agent_loop/tool_calls_total``, ``agent_loop/tool_call_errors_total``,
    ``agent_loop/tool_call_success_rate``, 1 when no call was made)."""
    metric = {key: np.array([getattr(o.metrics, key) for o in outputs], dtype=np.float64) for key in _TIMED}
    metrics: dict[str, float] = {}
    for key, values in metric.items():
        metrics.update(_stats(f"agent_loop/{key}", values))
    slowest = int(np.argmax(metric["generate_sequences"] + metric["tool_calls"] + metric["compute_score"]))
    for key, values in metric.items():
        metrics[f"agent_loop/slowest/{key}"] = float(values[slowest])
    metrics["agent_loop/slowest/prompt_length"] = float(attention_mask[slowest, :prompt_length].sum())
    metrics["agent_loop/slowest/response_length"] = float(attention_mask[slowest, prompt_length:].sum())
    calls = sum(int(o.extra_fields.get("num_tool_calls") or 0) for o in outputs)
    errors = sum(int(o.extra_fields.get("num_tool_call_errors") or 0) for o in outputs)
    metrics["agent_loop/tool_calls_total"] = float(calls)
    metrics["agent_loop/tool_call_errors_total"] = float(errors)
    metrics["agent_loop/tool_call_success_rate"] = 1.0 - errors / calls if calls else 1.0
    return metrics


_TIMED = ("generate_sequences", "tool_calls", "compute_score", "num_preempted")


class AgentLoopManager:
    """Runs a prompt batch's agent loops on a worker group's rollout engines (see the module).

    Args:
        config: the whole trainer config (typed :class:`~verl.workers.config.PPOConfig`, or a mapping of the same
            shape); loops get it as ``trainer_config`` and ``config.data`` as ``data_config``.
        worker_group: answers ``generate_tokens`` (and ``release_rollout`` after each batch, when it has it).
        tokenizer: the model's tokenizer (its chat template renders the conversations; its pad id pads).
        tools: the tools every loop gets; None: loaded from ``multi_turn.tool_config_path`` and
            ``multi_turn.function_tool_path``.
        gather_window_s: the server's gather window (see :class:`WorkerGroupServer`).
    """

    def __init__(self, config: Any, worker_group: Any, tokenizer: Any, tools: list | None = None, gather_window_s=0.02):
        self.config = config
        self.rollout = config.actor_rollout_ref.rollout
        agent = self.rollout.agent
        if config_value(agent, "agent_loop_config_path"):
            load_agent_loop_config(agent.agent_loop_config_path)
        self.default_agent_loop = config_value(agent, "default_agent_loop") or "single_turn_agent"
        self.num_workers = max(1, int(config_value(agent, "num_workers") or 1))
        self.tools = self._load_tools() if tools is None else list(tools)
        self.tokenizer = tokenizer
        self.worker_group = worker_group
        self.prompt_length, self.response_length = int(self.rollout.prompt_length), int(self.rollout.response_length)
        max_model_len = config_value(self.rollout, "max_model_len")
        self.server = WorkerGroupServer(
            worker_group, self.prompt_length, self.response_length, max_model_len, gather_window_s=gather_window_s
        )

    def _load_tools(self) -> list:
        from verl.experimental.agent_loop.utils import resolve_config_path
        from verl.tools.tool_registry import load_all_tools

        multi_turn = self.rollout.multi_turn
        paths = [config_value(multi_turn, key) for key in ("tool_config_path", "function_tool_path")]
        resolved = [resolve_config_path(path) if path else None for path in paths]
        return load_all_tools(tool_config_path=resolved[0], function_tool_path=resolved[1])

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """The trajectories of ``prompts`` (``n`` per row: ``meta_info["n"]``, else ``rollout.n``) as a batch."""
        try:
            return asyncio.run(self._generate(prompts))
        finally:
            release = getattr(self.worker_group, "release_rollout", None)
            if release is not None:
                release()

    async def _generate(self, prompts: DataProto) -> DataProto:
        n = int(prompts.meta_info.get("n", self.rollout.n))
        repeated = prompts.repeat(n, interleave=True) if n > 1 else prompts
        sampling = sampling_params_for(self.rollout, prompts.meta_info)
        rows = [loop_kwargs(repeated.non_tensor_batch, row) for row in range(len(repeated))]
        for _ in rows:  # every trajectory counts as in flight from the start: the first batch waits for all
            self.server.begin_trajectory()
        groups = np.array_split(np.arange(len(rows)), min(self.num_workers, len(rows)))
        tasks = [asyncio.ensure_future(self._run_rows([rows[i] for i in group], sampling)) for group in groups]
        try:
            outputs = [output for part in await asyncio.gather(*tasks) for output in part]
        finally:
            for task in tasks:
                task.cancel()
        return self._batch(repeated, outputs, sampling)

    async def _run_rows(self, rows: list[dict[str, Any]], sampling: dict[str, Any]) -> list[AgentLoopOutput]:
        """One of verl's agent-loop workers: its rows' loops, all at once."""
        return list(await asyncio.gather(*[self._run_row(kwargs, sampling) for kwargs in rows]))

    async def _run_row(self, kwargs: dict[str, Any], sampling: dict[str, Any]) -> AgentLoopOutput:
        kwargs = dict(kwargs)
        agent_name = kwargs.pop("agent_name", None) or self.default_agent_loop
        try:
            loop = instantiate_agent_loop(
                str(agent_name),
                trainer_config=DictConfigWrap(self.config),
                server_manager=self.server,
                tokenizer=self.tokenizer,
                processor=None,
                dataset_cls=None,
                data_config=DictConfigWrap(config_value(self.config, "data")),
                tools=ToolListWrap(self.tools),
            )
            return await loop.run(dict(sampling), **kwargs)
        finally:
            self.server.end_trajectory()

    def _batch(self, repeated: DataProto, outputs: list[AgentLoopOutput], sampling: dict[str, Any]) -> DataProto:
        pad_token_id = self.tokenizer.pad_token_id
        tensors, columns = assemble_batch(outputs, self.prompt_length, self.response_length, pad_token_id)
        if not self.rollout.calculate_log_probs:
            tensors.pop("rollout_log_probs", None)
        non_tensors = dict(repeated.non_tensor_batch)
        non_tensors.update(columns)
        if any("num_tool_calls" in o.extra_fields for o in outputs):  # verl's tool_call_counts/* metrics read it
            non_tensors["tool_call_counts"] = np.array(
                [int(o.extra_fields.get("num_tool_calls") or 0) for o in outputs], dtype=np.int64
            )
        meta_info = dict(repeated.meta_info)
        meta_info["temperature"] = sampling["temperature"] if sampling["temperature"] > 0 else 0.0
        metrics = agent_loop_metrics(outputs, tensors["attention_mask"], self.prompt_length)
        metrics["agent_loop/engine_calls"] = float(self.server.num_calls)
        # the response ids the model did not sample (tool / user turns): their response_mask is 0
        in_response = tensors["attention_mask"][:, self.prompt_length :].sum(-1) - tensors["response_mask"].sum(-1)
        metrics["agent_loop/non_model_tokens/mean"] = float(in_response.float().mean())
        meta_info["agent_loop_metrics"] = metrics
        self.server.num_calls = self.server.num_requests = 0
        return DataProto.from_dict(tensors, non_tensors, meta_info)
