"""Pipeline stages of a megatron-core GPTModel, run on any device (gloo on CPU, NCCL on CUDA).

With ``pipeline_model_parallel_size = p`` each rank of a pipeline group holds a contiguous share of the layers (the
first stage also the embedding, the last the final norm and the output layer). A forward pass is a relay: a stage
receives the previous stage's hidden states ``(S, B, H)`` (``S / tp`` with sequence parallelism), runs its layers
and sends its output on; the last stage's output is the model's. A backward pass runs the relay in reverse: a stage
receives the gradient of its output and sends the gradient of its input back.

This module is that relay and nothing else, one micro-batch at a time (no overlap between stages), which keeps it
correct on every backend the process groups run on. megatron-core's own schedules (1F1B, interleaved) overlap the
stages but allocate on CUDA; the GPU path trains with them
(:class:`~verl.workers.actor.megatron_backend.MegatronScheduleBackend`), the torch.optim adapter path (CPU, or
``use_megatron_optimizer=false``) with :func:`stage_forward` and :func:`stage_backward`.

What the last stage computes from its output (log-probs, the next token's logits) reaches the other stages through
:func:`broadcast_from_last_stage`, so that every rank of the group returns the same result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from verl.models.mcore.model import unwrap_model

__all__ = [
    "PipelineStage",
    "broadcast_from_last_stage",
    "check_pipeline_fits",
    "gather_stages",
    "stage_backward",
    "stage_forward",
    "stage_state_dict",
]


def check_pipeline_fits(hf_config: Any, stages: int, key: str, split: dict[str, Any] | None = None) -> None:
    """Refuse a pipeline layout that megatron-core cannot share the model's layers out over, naming the key.

    megatron-core shares ``num_layers`` out evenly, after the first and last stage take
    ``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage`` when set; with
    ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split`` the embedding and the loss
    count as one layer each. Its own errors for a layout that does not fit are an ``AssertionError`` or an invalid
    checkpoint offset, neither naming the setting.

    Args:
        hf_config: the Hugging Face config.
        stages: the pipeline-parallel size.
        key: the section's key of the size (``...megatron.pipeline_model_parallel_size``), for the message.
        split: the section's ``override_transformer_config`` entries that share the layers out (a
            ``pipeline_model_parallel_layout`` is megatron-core's to check).

    Raises:
        ValueError: a layout that does not fit the model's layers.
    """
    split = dict(split or {})
    if stages == 1 or split.get("pipeline_model_parallel_layout"):
        return
    layers = hf_config.num_hidden_layers
    section = key.rsplit(".", 1)[0]
    ends = {name: split.get(f"num_layers_in_{name}_pipeline_stage") for name in ("first", "last")}
    for name, count in ends.items():
        if count is not None and not 0 < count < layers:
            raise ValueError(
                f"{section}.override_transformer_config.num_layers_in_{name}_pipeline_stage={count}: the model has "
                f"{layers} layers over {stages} pipeline stages; set a count below {layers}, or leave it out."
            )
    rest = layers + bool(split.get("account_for_embedding_in_pipeline_split"))
    rest += bool(split.get("account_for_loss_in_pipeline_split"))
    rest -= sum(count for count in ends.values() if count is not None)
    middle = stages - sum(count is not None for count in ends.values())
    if (middle == 0 and rest != 0) or (middle > 0 and (rest <= 0 or rest % middle)):
        set_ends = ", ".join(f"{name} stage {count}" for name, count in ends.items() if count is not None)
        raise ValueError(
            f"{key}={stages}: the model's {layers} layers do not share out evenly over {stages} pipeline stages"
            + (f" after the {set_ends} layers set by override_transformer_config" if set_ends else "")
            + f"; choose a size that divides the layer count, or set {section}.override_transformer_config."
            "num_layers_in_first_pipeline_stage / num_layers_in_last_pipeline_stage to fit."
        )


@dataclass(frozen=True)
class PipelineStage:
    """Where this rank sits in its pipeline group.

    Attributes:
        index: this stage's index, 0 .. size-1.
        size: the number of stages.
        group: the pipeline-parallel process group.
        prev_rank: the previous stage's global rank (None on the first stage).
        next_rank: the next stage's global rank (None on the last stage).
        last_rank: the last stage's global rank (the source of what the last stage computes).
    """

    index: int
    size: int
    group: Any
    prev_rank: int | None
    next_rank: int | None
    last_rank: int

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.size - 1

    @classmethod
    def of_model(cls, model: torch.nn.Module) -> PipelineStage | None:
        """The stage of this rank's part of ``model`` (possibly wrapped); None for a model built whole."""
        if getattr(unwrap_model(model).config, "pipeline_model_parallel_size", 1) == 1:
            return None
        return cls.of_this_rank()

    @classmethod
    def of_this_rank(cls) -> PipelineStage | None:
        """This rank's stage from megatron-core's groups; None without pipeline parallelism (one stage)."""
        from megatron.core import parallel_state

        if not parallel_state.model_parallel_is_initialized():
            return None
        size = parallel_state.get_pipeline_model_parallel_world_size()
        if size == 1:
            return None
        index = parallel_state.get_pipeline_model_parallel_rank()
        group = parallel_state.get_pipeline_model_parallel_group()
        ranks = dist.get_process_group_ranks(group)
        return cls(
            index=index,
            size=size,
            group=group,
            prev_rank=None if index == 0 else ranks[index - 1],
            next_rank=None if index == size - 1 else ranks[index + 1],
            last_rank=ranks[-1],
        )


def _hidden_shape(model: torch.nn.Module, input_ids: torch.Tensor) -> tuple[int, int, int]:
    """The hidden states a stage passes on for ``input_ids`` (B, S): (S, B, H), the sequence split over the
    tensor-parallel ranks under sequence parallelism."""
    config = unwrap_model(model).config
    seq_len = input_ids.shape[1]
    if config.sequence_parallel:
        seq_len //= config.tensor_model_parallel_size
    return seq_len, input_ids.shape[0], config.hidden_size


def _transport_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype hidden states travel in between stages: megatron-core's ``pipeline_dtype`` (the parameters')."""
    config = unwrap_model(model).config
    return config.pipeline_dtype or config.params_dtype


def _device(model: torch.nn.Module) -> torch.device:
    return next(unwrap_model(model).parameters()).device


def stage_forward(
    model: torch.nn.Module, stage: PipelineStage, *, input_ids: torch.Tensor, **kwargs
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """This stage's part of a forward pass: receive the previous stage's hidden states, run, send the output on.

    Every stage calls ``model(input_ids=input_ids, **kwargs)`` with the same arguments (a stage after the first
    reads its input from the previous stage instead of the embedding, and uses ``input_ids`` for the shapes).
    With gradients enabled the received hidden states require grad, so that :func:`stage_backward` can send their
    gradient back.

    Returns:
        (the received hidden states, or None on the first stage; this stage's output: the model's output on the
        last stage, the hidden states it sent on elsewhere).
    """
    received = None
    if not stage.is_first:
        received = torch.empty(_hidden_shape(model, input_ids), dtype=_transport_dtype(model), device=_device(model))
        dist.recv(received, src=stage.prev_rank, group=stage.group)
        received.requires_grad_(torch.is_grad_enabled())
        unwrap_model(model).set_input_tensor(received)
    output = model(input_ids=input_ids, **kwargs)
    if not stage.is_last:
        dist.send(output.detach().to(_transport_dtype(model)).contiguous(), dst=stage.next_rank, group=stage.group)
    return received, output


def stage_backward(
    model: torch.nn.Module,
    stage: PipelineStage,
    received: torch.Tensor | None,
    output: torch.Tensor,
    loss: torch.Tensor | None = None,
) -> None:
    """This stage's part of the backward pass of what :func:`stage_forward` returned.

    The last stage runs ``loss`` (already scaled and weighted) backward; the others receive the gradient of their
    output from the next stage. Every stage after the first sends the gradient of its input back.
    """
    if stage.is_last:
        loss.backward()
    else:
        # the next stage received this output in the transport dtype; its gradient comes back in it
        grad = torch.empty(output.shape, dtype=_transport_dtype(model), device=output.device)
        dist.recv(grad, src=stage.next_rank, group=stage.group)
        torch.autograd.backward(output, grad.to(output.dtype))
    if not stage.is_first:
        grad_in = received.grad if received.grad is not None else torch.zeros_like(received)
        dist.send(grad_in.contiguous(), dst=stage.prev_rank, group=stage.group)


def broadcast_from_last_stage(
    stage: PipelineStage, tensors: list[torch.Tensor | None], shapes: list[tuple[int, ...]], dtype: torch.dtype, device
) -> list[torch.Tensor]:
    """What the last stage computed, on every stage of the group.

    Args:
        stage: this rank's stage.
        tensors: the last stage's results (ignored elsewhere).
        shapes: their shapes, which every stage knows.
        dtype: their dtype on the wire and on return.
        device: where the other stages receive them.
    """
    out = []
    for tensor, shape in zip(tensors, shapes, strict=True):
        buffer = tensor.to(dtype).contiguous() if stage.is_last else torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(buffer, src=stage.last_rank, group=stage.group)
        out.append(buffer)
    return out


# ---------------------------------------------------------------------- a stage's weights and the whole model's

_LAYER_PREFIX = "decoder.layers."
_FIRST_STAGE_PREFIXES = ("embedding.",)
_LAST_STAGE_PREFIXES = ("decoder.final_layernorm.", "output_layer.")


def _global_layer_numbers(model: torch.nn.Module) -> list[int]:
    """The 0-based indices in the whole model of this stage's layers (megatron-core numbers them from 1)."""
    return [layer.layer_number - 1 for layer in unwrap_model(model).decoder.layers]


def _split_layer_key(key: str) -> tuple[int, str] | None:
    if not key.startswith(_LAYER_PREFIX):
        return None
    index, rest = key[len(_LAYER_PREFIX) :].split(".", 1)
    return int(index), rest


def stage_state_dict(whole: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This stage's part of a whole-model state dict (megatron names), under the stage's own names.

    Layers are renumbered from the model's index to the stage's; the embedding goes to the first stage, the final
    norm and the output layer to the last. A tied model has no ``output_layer.weight`` of its own: the last stage's
    copy of the embedding gets the embedding's values.
    """
    inner = unwrap_model(model)
    local_of = {global_index: local for local, global_index in enumerate(_global_layer_numbers(model))}
    part = {}
    for key, value in whole.items():
        layer = _split_layer_key(key)
        if layer is not None:
            if layer[0] in local_of:
                part[f"{_LAYER_PREFIX}{local_of[layer[0]]}.{layer[1]}"] = value
        elif (inner.pre_process and key.startswith(_FIRST_STAGE_PREFIXES)) or (
            inner.post_process and key.startswith(_LAST_STAGE_PREFIXES)
        ):
            part[key] = value
    has_output_weight = getattr(getattr(inner, "output_layer", None), "weight", None) is not None
    if inner.post_process and has_output_weight and "output_layer.weight" not in part:
        part["output_layer.weight"] = whole["embedding.word_embeddings.weight"]
    return part


def gather_stages(state: dict[str, torch.Tensor], model: torch.nn.Module, stage: PipelineStage):
    """The whole model's state dict (megatron names) from every stage's ``state``, on every stage; a collective
    over the pipeline group. Layers are renumbered to the model's indices; a tied model's copy of the embedding on
    the last stage is left out (the whole model has one matrix)."""
    numbers = _global_layer_numbers(model)
    renamed = {}
    for key, value in state.items():
        layer = _split_layer_key(key)
        name = key if layer is None else f"{_LAYER_PREFIX}{numbers[layer[0]]}.{layer[1]}"
        renamed[name] = value.detach().cpu() if isinstance(value, torch.Tensor) else value
    inner = unwrap_model(model)
    if stage.is_last and getattr(getattr(inner.output_layer, "weight", None), "shared_embedding", False):
        renamed.pop("output_layer.weight", None)
    parts: list[dict | None] = [None] * stage.size
    dist.all_gather_object(parts, renamed, group=stage.group)
    whole = {}
    for part in parts:
        whole.update(part)
    return whole
