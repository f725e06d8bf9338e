"""Tensor-parallel shards of a megatron-core GPTModel's weights: cut a full state dict into one rank's part, and
gather the parts of a model back into the full state dict.

megatron-core splits each weight of a GPTModel over the tensor-parallel ranks in one of four ways, which this
module names by key (``SHARD_RULES``):

- column-parallel (``dim0``): the fused ``linear_qkv`` weight and bias (its rows are grouped per query group, see
  :mod:`verl.models.mcore.weight_converter`, so rank ``r`` holds whole query groups), the vocabulary-parallel
  ``word_embeddings`` and the ``output_layer`` (rank ``r`` holds vocabulary rows ``r*V/tp .. (r+1)*V/tp``);
- row-parallel (``dim1``): ``linear_proj`` and ``linear_fc2``, split along their input features;
- the gated ``linear_fc1`` (``glu``): gate and up rows are each split, and rank ``r`` holds
  ``[gate_r; up_r]``, which is how megatron's gated-linear-unit halves its local output;
- everything else (the RMSNorm weights) is replicated.

A LoRA adapter's split part (``B`` of a column-parallel layer, ``A`` of a row-parallel one) follows its layer's rule;
the other part is replicated.

Sharding is slicing: ``shard_state_dict(full, r, tp)[k]`` is a view of ``full[k]``, and
``gather_state_dict`` of every rank's shards is ``full`` again. Tied embeddings need nothing more: with one
pipeline stage the output layer reuses the embedding's (vocabulary-parallel) parameter.

``gather_vocab_parallel_logits`` turns an output layer's vocabulary slice into the whole vocabulary on every rank
(differentiably), on any device.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "SHARD_RULES",
    "check_tensor_parallel_fits",
    "gather_state_dict",
    "gather_vocab_parallel_logits",
    "shard_rule",
    "shard_state_dict",
]

#: (key suffix, how it is split). The first suffix a key ends with decides; no match means replicated.
SHARD_RULES: tuple[tuple[str, str], ...] = (
    (".linear_qkv.weight", "dim0"),
    (".linear_qkv.bias", "dim0"),
    ("word_embeddings.weight", "dim0"),
    ("output_layer.weight", "dim0"),
    (".linear_fc1.weight", "glu"),
    (".linear_proj.weight", "dim1"),
    (".linear_fc2.weight", "dim1"),
    # LoRA adapters (verl.models.mcore.lora): the part of B A each rank holds shards like its layer's weight
    (".linear_qkv.adapter.lora_B.weight", "dim0"),
    (".linear_fc1.adapter.lora_B.weight", "glu"),
    (".linear_proj.adapter.lora_A.weight", "dim1"),
    (".linear_fc2.adapter.lora_A.weight", "dim1"),
)


def shard_rule(key: str) -> str:
    """How the megatron weight ``key`` is split over tensor-parallel ranks: ``dim0``, ``dim1``, ``glu`` or
    ``replicated``."""
    for suffix, rule in SHARD_RULES:
        if key.endswith(suffix):
            return rule
    return "replicated"


def _slice(tensor: torch.Tensor, rule: str, rank: int, size: int) -> torch.Tensor:
    if rule == "replicated" or size == 1:
        return tensor
    if rule == "glu":
        gate, up = torch.chunk(tensor, 2, dim=0)
        return torch.cat([torch.chunk(gate, size, dim=0)[rank], torch.chunk(up, size, dim=0)[rank]], dim=0)
    dim = 0 if rule == "dim0" else 1
    assert tensor.shape[dim] % size == 0, f"dimension {dim} of {tuple(tensor.shape)} does not split {size} ways"
    return torch.chunk(tensor, size, dim=dim)[rank]


def shard_state_dict(state_dict: dict[str, torch.Tensor], rank: int, size: int) -> dict[str, torch.Tensor]:
    """Tensor-parallel rank ``rank``'s part of a full (unsharded) GPTModel state dict.

    Args:
        state_dict: megatron names and full shapes, e.g. from ``hf_to_mcore_state_dict``.
        rank: this rank's tensor-parallel rank.
        size: the tensor-parallel size.

    Returns:
        The same keys, each tensor cut per :data:`SHARD_RULES` (views where slicing allows; ``linear_fc1`` is a
        new tensor, its gate and up parts being apart in the full one).
    """
    return {key: _slice(value, shard_rule(key), rank, size) for key, value in state_dict.items()}


def _concat(parts: list[torch.Tensor], rule: str) -> torch.Tensor:
    if rule == "glu":
        halves = [torch.chunk(part, 2, dim=0) for part in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(parts, dim=0 if rule == "dim0" else 1)


def gather_state_dict(state_dict: dict[str, torch.Tensor], group: Any, size: int) -> dict[str, torch.Tensor]:
    """The full state dict from every tensor-parallel rank's shards; a collective over ``group``.

    Every rank of ``group`` must call it with the same keys in the same order (state dicts of models built from
    the same config are). Replicated tensors are taken from this rank as they are.

    Args:
        state_dict: this rank's shards (megatron names).
        group: the tensor-parallel process group.
        size: its size.

    Returns:
        Full tensors (new ones for the split keys; this rank's own tensors for the replicated ones).
    """
    if size == 1:
        return dict(state_dict)
    full = {}
    for key, value in state_dict.items():
        rule = shard_rule(key)
        if rule == "replicated" or not isinstance(value, torch.Tensor):
            full[key] = value
            continue
        parts = [torch.empty_like(value) for _ in range(size)]
        dist.all_gather(parts, value.detach().contiguous(), group=group)
        full[key] = _concat(parts, rule)
    return full


def check_tensor_parallel_fits(hf_config: Any, size: int, key: str) -> None:
    """Refuse a tensor-parallel size that megatron-core cannot split this model by.

    Args:
        hf_config: the Hugging Face config.
        size: the tensor-parallel size.
        key: the config key that set it, for the message.

    Raises:
        ValueError: a head, query-group, MLP or vocabulary count not divisible by ``size``.
    """
    if size == 1:
        return
    num_heads = hf_config.num_attention_heads
    counts = {
        "num_attention_heads": num_heads,
        "num_key_value_heads": getattr(hf_config, "num_key_value_heads", None) or num_heads,
        "intermediate_size": hf_config.intermediate_size,
        "vocab_size": hf_config.vocab_size,
    }
    bad = {name: count for name, count in counts.items() if count % size}
    if bad:
        raise ValueError(
            f"{key}={size}: megatron-core splits attention heads, key/value groups, MLP features and the vocabulary "
            f"evenly over the tensor-parallel ranks, but this model has {bad}, not divisible by {size}. Choose a "
            "size that divides them all (1 always does)."
        )


class _GatherVocabulary(torch.autograd.Function):
    """All-gather vocabulary-parallel logits along the last dimension; the backward keeps this rank's slice.

    megatron-core's own gather allocates on ``torch.cuda.current_device()``, so it cannot run on CPU. Its backward
    is the same: every tensor-parallel rank computes the same loss from the gathered logits, so each one's gradient
    for its own vocabulary slice is already complete.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, group: Any, size: int, rank: int) -> torch.Tensor:
        ctx.rank, ctx.size = rank, size
        parts = [torch.empty_like(logits) for _ in range(size)]
        dist.all_gather(parts, logits.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return torch.chunk(grad, ctx.size, dim=-1)[ctx.rank].contiguous(), None, None, None


def gather_vocab_parallel_logits(logits: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary logits from this rank's vocabulary-parallel part (differentiable; a no-op without tensor
    parallelism).

    Args:
        logits: ``(..., V / tp)`` logits of this rank's vocabulary slice.

    Returns:
        ``(..., V)`` logits, identical on every tensor-parallel rank.
    """
    from megatron.core import parallel_state

    size = parallel_state.get_tensor_model_parallel_world_size()
    if size == 1:
        return logits
    group = parallel_state.get_tensor_model_parallel_group()
    return _GatherVocabulary.apply(logits, group, size, parallel_state.get_tensor_model_parallel_rank())
