"""Generation for a list of token-id requests: what an agent loop's server client asks of a rollout engine.

An agent loop sends one request per turn: the ids of the conversation so far, and its sampling options
(``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_token_ids``). The driver's client gathers the
requests of many trajectories in flight into one batch (:mod:`verl.experimental.agent_loop.server`), which reaches
each data-parallel rank as a :class:`~verl.protocol.DataProto` of requests, and the rank answers them with its
rollout's own batched generation (``naive``, ``hf`` or ``vllm``: :meth:`BaseRollout.generate_sequences`), so every
engine serves agent loops without a server of its own.

The request batch (:func:`make_request_batch`): non-tensor ``prompt_ids`` (one list of ids per request) and
``max_tokens`` (each request's budget), a ``prompt_length`` tensor, and in ``meta_info["sampling"]`` the options the
whole call shares: ``temperature``, ``top_p``, ``top_k``, ``do_sample``, ``stop_token_ids`` and ``max_tokens``, the
largest budget of the call. Every rank generates up to that same largest budget (a sharded model's ranks must take
the same number of steps), then each request is cut to its own. Requests of different lengths batch together: the
prompts are left-padded to the longest.

The answer (:func:`generate_for_requests`): non-tensor ``token_ids`` and ``log_probs`` (lists, the engine's own
log-probs of the sampled tokens) and ``finish_reason`` (``stop``: the request ended on an eos or one of its stop
ids, which is kept; ``length``: its budget ran out), the number of tokens as a ``num_tokens`` tensor.
A per-request ``seed`` is not honoured: the engine's own seeded stream draws (reproducible per call order).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.workers.rollout.postprocess import compute_position_ids

__all__ = ["SAMPLING_KEYS", "generate_for_requests", "left_padded_prompts", "make_request_batch"]

# the sampling options one engine call shares (the rollout's names); max_tokens and stop ids come apart
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "do_sample")


def make_request_batch(
    prompt_ids: Sequence[Sequence[int]],
    max_tokens: Sequence[int],
    sampling: Mapping[str, Any],
    stop_token_ids: Sequence[int] = (),
) -> DataProto:
    """The request batch of one engine call (see the module for its fields).

    Args:
        prompt_ids: each request's prompt ids (any lengths, none empty).
        max_tokens: each request's budget of new tokens (>= 1).
        sampling: the call's shared options (:data:`SAMPLING_KEYS`; missing ones keep the rollout's).
        stop_token_ids: ids that end a response besides the eos ids (kept in the response, as an eos is).

    Raises:
        ValueError: no requests, an empty prompt, or a budget below 1.
    """
    if not prompt_ids or len(prompt_ids) != len(max_tokens):
        raise ValueError(f"need one max_tokens per request, got {len(prompt_ids)} prompts, {len(max_tokens)} budgets")
    if any(len(ids) == 0 for ids in prompt_ids) or min(max_tokens) < 1:
        raise ValueError("every request needs a non-empty prompt and max_tokens >= 1")
    ids = np.empty(len(prompt_ids), dtype=object)
    ids[:] = [[int(token) for token in row] for row in prompt_ids]
    call = {key: sampling[key] for key in SAMPLING_KEYS if key in sampling}
    call.update(stop_token_ids=sorted({int(i) for i in stop_token_ids}), max_tokens=int(max(max_tokens)))
    return DataProto.from_dict(
        tensors={"prompt_length": torch.tensor([len(row) for row in ids], dtype=torch.long)},
        non_tensors={"prompt_ids": ids, "max_tokens": np.asarray(max_tokens, dtype=np.int64)},
        meta_info={"sampling": call},
    )


def left_padded_prompts(prompt_ids: Sequence[Sequence[int]], pad_token_id: int) -> DataProto:
    """The rollout's prompt layout for requests of any lengths: ``input_ids``, ``attention_mask`` and
    ``position_ids`` (B, longest prompt), left-padded with ``pad_token_id``."""
    width = max(len(row) for row in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
        attention_mask[row, width - len(ids) :] = 1
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": compute_position_ids(attention_mask),
    }
    return DataProto.from_dict(tensors=tensors)


@contextlib.contextmanager
def _call_settings(engine: Any, call: Mapping[str, Any]) -> Iterator[None]:
    """The engine's sampling options and stop ids set to the call's for the block, then put back: one response per
    prompt, ``response_length`` = the call's largest budget, its extra stop ids beside the eos ids."""
    params, eos_ids = engine.params, engine.eos_ids
    options = {key: call[key] for key in SAMPLING_KEYS if key in call}
    engine.params = params.replace(n=1, response_length=int(call["max_tokens"]), **options)
    extra = [i for i in call.get("stop_token_ids", []) if i not in eos_ids]
    engine.eos_ids = list(eos_ids) + extra
    try:
        yield
    finally:
        engine.params, engine.eos_ids = params, eos_ids


def generate_for_requests(engine: Any, requests: DataProto, device: str | torch.device = "cpu") -> DataProto:
    """Answer a request batch with ``engine`` (a :class:`~verl.workers.rollout.base.BaseRollout`).

    Args:
        engine: the rollout; its ``generate_sequences`` runs once on all the requests, left-padded.
        requests: a batch from :func:`make_request_batch` (this rank's share of it).
        device: where the prompts go.

    Returns:
        One row per request (see the module): ``token_ids``, ``log_probs``, ``finish_reason``, ``num_tokens``.
    """
    prompt_ids = list(requests.non_tensor_batch["prompt_ids"])
    budgets = [int(b) for b in requests.non_tensor_batch["max_tokens"]]
    call = requests.meta_info["sampling"]
    with _call_settings(engine, call):
        stop_ids = set(engine.stop_ids)
        output = engine.generate_sequences(left_padded_prompts(prompt_ids, engine.pad_token_id).to(device))
    responses = output.batch["responses"].cpu()
    mask = output.batch["response_mask"].cpu().bool()
    log_probs = output.batch["rollout_log_probs"].cpu() if "rollout_log_probs" in output.batch.keys() else None
    token_ids, token_log_probs, reasons = [], [], []
    for row, budget in enumerate(budgets):
        ids = responses[row][mask[row]][:budget].tolist()
        token_ids.append(ids)
        kept = log_probs[row][mask[row]][:budget].tolist() if log_probs is not None else None
        token_log_probs.append(kept)
        reasons.append("stop" if ids and ids[-1] in stop_ids else "length")
    return DataProto.from_dict(
        tensors={"num_tokens": torch.tensor([len(ids) for ids in token_ids], dtype=torch.long)},
        non_tensors={
            "token_ids": _objects(token_ids),
            "log_probs": _objects(token_log_probs),
            "finish_reason": _objects(reasons),
        },
    )


def _objects(values: list) -> np.ndarray:
    """A 1-D object array holding ``values`` as they are (lists stay lists)."""
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array
