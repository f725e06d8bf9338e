"""The megatron backend's ``model.use_fused_kernels``: log-probs and entropy computed in the GPTModel's output layer,
a chunk of tokens at a time, from its input hidden states (see :mod:`verl.utils.kernel.linear_cross_entropy`).

:func:`use_fused_head` turns a GPTModel's output layer into a :class:`FusedHeadOutputLayer`; while
:func:`fused_head_request` holds a request, a forward pass of the model leaves the response tokens' log-probs (and
entropy) on it and returns placeholder logits. megatron-core's own forward, schedules and tensor-parallel layers
run unchanged around it.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from megatron.core.tensor_parallel import ColumnParallelLinear

from verl.models.mcore.layer_spec import PortableOutputLayer
from verl.models.mcore.model import unwrap_model


@dataclasses.dataclass
class FusedHeadRequest:
    """What :class:`FusedHeadOutputLayer` computes in the current forward pass, and (after it) its result."""

    input_ids: torch.Tensor
    response_length: int
    temperature: float
    calculate_entropy: bool
    result: tuple[torch.Tensor, torch.Tensor | None] | None = None


class FusedHeadOutputLayer(PortableOutputLayer):
    """The output layer of ``model.use_fused_kernels``: while a :class:`FusedHeadRequest` is set, it computes the
    response tokens' log-probs (and entropy) from its input hidden states a chunk of tokens at a time
    (:func:`verl.utils.kernel.linear_cross_entropy.response_log_probs_from_hidden`) and stores them on the request,
    so that the whole (tokens, vocab) logits never exist; the model then returns placeholder logits (one zero per
    position). Without a request (the rollout's decoding) it is the plain output layer.

    Under tensor parallelism each rank holds a vocabulary slice of the weight: the slices are gathered into the
    whole projection (its backward keeps each rank's slice, every rank computing the same log-probs), and with
    sequence parallelism the hidden states are gathered along the sequence first, as the plain layer does.
    """

    fused_request: FusedHeadRequest | None = None

    def forward(self, input_: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output=None):
        request = self.fused_request
        if request is None:
            return super().forward(input_, weight=weight, runtime_gather_output=runtime_gather_output)
        from verl.models.mcore.tensor_parallel import gather_vocab_parallel_logits
        from verl.utils.kernel.linear_cross_entropy import response_log_probs_from_hidden

        hidden = input_
        if self.sequence_parallel:
            from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

            # every rank computes the whole loss from the whole sequence, so its gradient is already complete: the
            # backward keeps this rank's part of it (no reduce-scatter of the sum over ranks)
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        shard = self.weight if weight is None else weight
        # (V/tp, H) -> (V, H): the gather runs along the last dimension, hence the transposes
        full_weight = gather_vocab_parallel_logits(shard.t()).t()
        request.result = response_log_probs_from_hidden(
            hidden.transpose(0, 1),  # megatron's (S, B, H) -> (B, S, H)
            full_weight,
            request.input_ids,
            request.response_length,
            request.temperature,
            request.calculate_entropy,
        )
        return hidden.new_zeros(hidden.shape[0], hidden.shape[1], 1), None


def use_fused_head(model: torch.nn.Module) -> None:
    """Turn the GPTModel's output layer into a :class:`FusedHeadOutputLayer` (same parameters; ``model`` may be
    wrapped in megatron-core DDP / Float16Module)."""
    inner = unwrap_model(model)
    layer = getattr(inner, "output_layer", None)
    if not isinstance(layer, ColumnParallelLinear):
        raise ValueError(
            f"model.use_fused_kernels=true needs a GPTModel whose last pipeline stage has a vocabulary-parallel "
            f"output layer; {type(inner).__name__} has {type(layer).__name__}. Set it to false."
        )
    layer.__class__ = FusedHeadOutputLayer


@contextlib.contextmanager
def fused_head_request(model: torch.nn.Module, request: FusedHeadRequest | None):
    """While the block runs, ``model``'s fused output layer computes ``request`` (see :func:`use_fused_head`); a
    None request leaves the layer plain."""
    if request is None:
        yield None
        return
    layer = unwrap_model(model).output_layer
    layer.fused_request = request
    try:
        yield request
    finally:
        layer.fused_request = None
