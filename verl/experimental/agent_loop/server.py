"""The server manager of the agent loops here: the rollout engines of a worker group, behind verl's
``generate(request_id, *, prompt_ids, sampling_params, image_data=None) -> TokenOutput``.

verl runs its rollout engines as HTTP-like servers that take one request at a time and batch them inside the
engine. Here the engines live in the trainer's (or the rollout group's) worker processes and generate in batches,
so :class:`WorkerGroupServer` batches on the driver: each ``generate`` call of a loop waits in a queue, and the
queue goes to the workers as one call (``generate_tokens``, :mod:`verl.workers.rollout.token_requests`), whose
rows the worker group spreads over its data-parallel ranks. A batch leaves when every trajectory in flight is
waiting for a generation (none is in a tool call), or after a short gather window (``gather_window_s``); while a
batch runs, the requests of the trajectories that come back from their tools gather for the next one. Requests
whose sampling options differ (temperature, top-p, top-k, stop ids) go in separate calls, one after the other.

``max_tokens`` as verl's server reads it: the request's own (``max_tokens`` or ``max_new_tokens``), else
``min(response_length, prompt_length + response_length - len(prompt_ids))``; never past the context
(``max_model_len``), and at least 1.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from collections.abc import Callable
from typing import Any

from verl.experimental.agent_loop.agent_loop import TokenOutput
from verl.workers.rollout.token_requests import make_request_batch

__all__ = ["WorkerGroupServer"]


@dataclasses.dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    key: tuple
    logprobs: bool
    future: asyncio.Future


def _sampling_key(params: dict[str, Any]) -> tuple:
    """The options that must be equal within one engine call."""
    temperature = float(params.get("temperature", 1.0))
    do_sample = bool(params.get("do_sample", True)) and temperature > 0
    top_k = int(params.get("top_k", -1) if params.get("top_k") is not None else -1)
    top_p = float(params.get("top_p", 1.0) if params.get("top_p") is not None else 1.0)
    stops = tuple(sorted({int(i) for i in params.get("stop_token_ids") or []}))
    return temperature, top_p, top_k, do_sample, stops


def _check_supported(params: dict[str, Any], image_data: Any) -> None:
    """Refuse what the engines here cannot honour, instead of sampling something else."""
    if image_data:
        raise NotImplementedError("multimodal generation (image_data) is not supported: rollouts are text-only here")
    penalty = params.get("repetition_penalty")
    if penalty is not None and float(penalty) != 1.0:
        raise ValueError(
            f"sampling_params repetition_penalty={penalty} is not supported: the trainer recomputes plain softmaxed "
            "log-probs, so the engines sample without penalties (leave it 1.0)"
        )
    if int(params.get("n", 1)) != 1:
        raise ValueError("sampling_params n must be 1: an agent loop asks for one continuation per generate call")


class WorkerGroupServer:
    """verl's server-manager contract over a worker group's ``generate_tokens`` (see the module).

    Args:
        worker_group: the group whose ``method`` answers a request batch (the actor group with its rollout, or the
            rollout group of its own); called on a thread of its own, one batch at a time.
        prompt_length: ``rollout.prompt_length``.
        response_length: ``rollout.response_length``.
        max_model_len: the longest sequence an engine takes (``rollout.max_model_len``, else prompt + response).
        gather_window_s: the longest a batch waits for more requests once the first one arrived.
        method: the worker group's method name.
    """

    def __init__(
        self,
        worker_group: Any,
        prompt_length: int,
        response_length: int,
        max_model_len: int | None = None,
        gather_window_s: float = 0.02,
        method: str = "generate_tokens",
    ):
        self.call: Callable[[Any], Any] = getattr(worker_group, method)
        self.prompt_length, self.response_length = int(prompt_length), int(response_length)
        self.max_model_len = int(max_model_len or prompt_length + response_length)
        self.gather_window_s = float(gather_window_s)
        self.active = 0  # trajectories in flight (begin_trajectory / end_trajectory)
        self.num_calls = 0  # engine calls made (one per batch and sampling key)
        self.num_requests = 0
        self._pending: list[_Request] = []
        self._drainer: asyncio.Task | None = None
        self._arrived: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-engine")

    # ------------------------------------------------------------------ bookkeeping of the manager

    def begin_trajectory(self) -> None:
        """One more trajectory in flight: a batch waits for its request while the gather window lasts."""
        self.active += 1

    def end_trajectory(self) -> None:
        self.active -= 1
        if self._arrived is not None:
            self._arrived.set()  # one fewer to wait for

    def close(self) -> None:
        self._executor.shutdown(wait=False)

    # ------------------------------------------------------------------ the contract

    def max_tokens_for(self, prompt_ids: list[int], params: dict[str, Any]) -> int:
        """The budget of one request (see the module).

        Raises:
            ValueError: the prompt leaves no room in the context.
        """
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"Prompt length ({len(prompt_ids)}) leaves no room to generate within the model's context "
                f"({self.max_model_len}); raise rollout.max_model_len or cut the conversation."
            )
        asked = params.get("max_tokens", params.get("max_new_tokens"))
        if asked is None:
            asked = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        return max(1, min(int(asked), room))

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Any] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """The model's continuation of ``prompt_ids`` (token ids in, token ids out), batched with the other
        trajectories' requests. ``request_id`` is not needed to route (every rank has the whole model)."""
        del request_id, kwargs
        params = dict(sampling_params or {})
        _check_supported(params, image_data)
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (one per batch of the manager): fresh loop-bound state
            self._loop, self._arrived, self._drainer, self._pending = loop, asyncio.Event(), None, []
        request = _Request(
            [int(t) for t in prompt_ids],
            self.max_tokens_for(list(prompt_ids), params),
            _sampling_key(params),
            bool(params.get("logprobs", True)),
            loop.create_future(),
        )
        self._pending.append(request)
        self._arrived.set()
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.ensure_future(self._drain())
        return await request.future

    # ------------------------------------------------------------------ batching

    async def _drain(self) -> None:
        """Send the queue in batches until it is empty."""
        while self._pending:
            await self._gather()
            batch, self._pending = self._pending, []
            groups: dict[tuple, list[_Request]] = {}
            for request in batch:
                groups.setdefault(request.key, []).append(request)
            for requests in groups.values():
                await self._send(requests)

    async def _gather(self) -> None:
        """Wait until every trajectory in flight has a request queued, or the gather window has passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.gather_window_s
        await asyncio.sleep(0)  # requests made in this same turn of the event loop join at once
        while len(self._pending) < self.active:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                return

    async def _send(self, requests: list[_Request]) -> None:
        """One engine call for requests sharing their sampling options; each future gets its answer (or the
        call's error)."""
        temperature, top_p, top_k, do_sample, stops = requests[0].key
        sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "do_sample": do_sample}
        batch = make_request_batch(
            [r.prompt_ids for r in requests], [r.max_tokens for r in requests], sampling, stop_token_ids=stops
        )
        batch.meta_info["keep_awake"] = True
        self.num_calls += 1
        self.num_requests += len(requests)
        try:
            output = await asyncio.get_running_loop().run_in_executor(self._executor, self.call, batch)
        except Exception as err:  # every trajectory of the call sees the engine's error
            for request in requests:
                if not request.future.done():
                    request.future.set_exception(err)
            return
        answers = output.non_tensor_batch
        for row, request in enumerate(requests):
            if request.future.done():  # its trajectory was cancelled
                continue
            log_probs = answers["log_probs"][row]
            request.future.set_result(
                TokenOutput(
                    token_ids=list(answers["token_ids"][row]),
                    log_probs=list(log_probs) if request.logprobs and log_probs is not None else None,
                    stop_reason="completed",
                    extra_fields={"finish_reason": str(answers["finish_reason"][row])},
                )
            )
