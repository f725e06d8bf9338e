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


def real_column_span(attention_mask: torch.Tensor) -> tuple[int, int]:
    """``(start, end)``: the columns outside ``[start, end)`` are padding in every row (one host sync).

    The dataloader left-pads every prompt to ``data.max_prompt_length`` and the rollout right-pads every response
    to ``response_length``; a batch whose longest prompt or response is shorter carries columns of padding only,
    which a forward pass may drop without changing any real token's output (positions come with the tokens).

    Returns:
        ``(0, 0)`` for a mask without any real token.
    """
    real = attention_mask.bool().any(dim=0).nonzero()
    if real.numel() == 0:
        return 0, 0
    start, last = real[[0, -1], 0].tolist()
    return start, last + 1


def trim_padding_columns(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Drop the columns of a rollout batch (B, P + R) that are padding in every row.

    The last prompt column is always kept (its logits predict the first response token), so the result keeps the
    layout: a prompt part followed by the first ``kept`` response columns.

    Returns:
        ``(input_ids, attention_mask, position_ids, kept)``: the trimmed (B, S') tensors (views) and the number of
        response columns left, ``0 <= kept <= response_length``; outputs for the dropped response columns are padding.
    """
    prompt_length = input_ids.shape[1] - response_length
    start, end = real_column_span(attention_mask)
    start, end = min(start, prompt_length - 1), max(end, prompt_length)
    columns = slice(start, end)
    return input_ids[:, columns], attention_mask[:, columns], position_ids[:, columns], end - prompt_length


def pad_response_columns(values: torch.Tensor, response_length: int) -> torch.Tensor:
    """Right-pad (B, kept) per-response-token outputs with zeros back to (B, ``response_length``)."""
    missing = response_length - values.shape[1]
    return torch.nn.functional.pad(values, (0, missing)) if missing > 0 else values
