"""Padding-free forward passes (``model.use_remove_padding``): the real tokens of a batch packed into one row.

A batch of left-padded prompts and right-padded responses spends its linear layers on padding. Packing puts only the
real tokens of every sample, one sample after another, into a single row of T tokens, with position ids that restart
at 0 for each sample; the model's linear layers and MLPs then cost what the real tokens cost. Attention must not look
across samples: with ``flash_attention_2`` the restarting position ids alone tell transformers where each sample
starts (a variable-length kernel, whose cost is the sum of the samples' squared lengths); with ``sdpa`` or ``eager``
a block-diagonal causal mask (T, T) does it, correct on every device but with dense attention over T, so on CPU the
saving is in the linear layers only. :func:`unpack` puts the outputs back at the padded positions (zeros at pads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Packed:
    """One packed row and what is needed to undo it.

    Attributes:
        input_ids: (1, T) the real tokens of every sample, in order.
        position_ids: (1, T) each sample's own positions (from 0).
        attention_mask: (1, 1, T, T) additive block-diagonal causal mask (0 allowed, -inf not), or None when the
            attention kernel takes the samples' boundaries from ``position_ids`` (flash attention).
        index: (T,) flat positions of the real tokens in the (B, S) batch.
        shape: (B, S).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    index: torch.Tensor
    shape: tuple[int, int]


def pack(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, *, block_mask: bool = True
) -> Packed:
    """Pack the real (``attention_mask == 1``) tokens of a (B, S) batch into one row.

    Args:
        input_ids, attention_mask, position_ids: (B, S) int64; position ids restart per sample (the shared layout's
            ``clamp(cumsum(attention_mask) - 1, 0)``), so the packed row keeps each sample's own positions.
        block_mask: build the (1, 1, T, T) mask for kernels that need one; False for flash attention.

    Returns:
        The :class:`Packed` row.
    """
    batch, seq = input_ids.shape
    real = attention_mask.reshape(-1).bool()
    index = real.nonzero(as_tuple=True)[0]
    packed_ids = input_ids.reshape(-1)[index][None]
    packed_pos = position_ids.reshape(-1)[index][None]
    mask = None
    if block_mask:
        sample = torch.arange(batch, device=input_ids.device).repeat_interleave(seq)[index]
        allowed = (sample[:, None] == sample[None, :]) & torch.ones(
            len(index), len(index), dtype=torch.bool, device=input_ids.device
        ).tril()
        mask = torch.zeros(allowed.shape, dtype=torch.float32, device=input_ids.device)
        mask = mask.masked_fill(~allowed, float("-inf"))[None, None]
    return Packed(packed_ids, packed_pos, mask, index, (batch, seq))


def unpack(packed_output: torch.Tensor, packed: Packed) -> torch.Tensor:
    """(1, T, ...) outputs of the packed row -> (B, S, ...) with zeros at the padded positions."""
    batch, seq = packed.shape
    trailing = packed_output.shape[2:]
    out = packed_output.new_zeros(batch * seq, *trailing)
    out[packed.index] = packed_output[0]
    return out.reshape(batch, seq, *trailing)


def uses_flash_attention(module: torch.nn.Module) -> bool:
    """Whether a Hugging Face model attends with flash attention (which reads sample boundaries from positions)."""
    config = getattr(module, "config", None)
    return "flash" in str(getattr(config, "_attn_implementation", "") or "")


def forward_packed(module: torch.nn.Module, input_ids, attention_mask, position_ids, **kwargs):
    """``module``'s output for a (B, S) batch, computed on its packed real tokens and unpacked to (B, S, ...).

    ``module`` is called as ``module(input_ids=, attention_mask=, position_ids=, **kwargs)`` and returns a tensor
    (B, S, ...) or an object with ``.logits`` or ``.last_hidden_state``.
    """
    packed = pack(input_ids, attention_mask, position_ids, block_mask=not uses_flash_attention(module))
    output = module(
        input_ids=packed.input_ids, attention_mask=packed.attention_mask, position_ids=packed.position_ids, **kwargs
    )
    for name in ("logits", "last_hidden_state"):
        if hasattr(output, name):
            return unpack(getattr(output, name), packed)
    return unpack(output, packed)
