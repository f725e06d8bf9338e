"""Full activation recomputation of a megatron-core decoder on CPU, by ``torch.utils.checkpoint``.

megatron-core's ``recompute_granularity='full'`` runs each group of layers under ``tensor_parallel.checkpoint``,
which saves and restores the CUDA RNG state, so it cannot run on a CPU-only torch. The layer grouping it asks for
needs no CUDA, though: :func:`recompute_on_cpu` gives a CPU model's decoder the same grouping with torch's
non-reentrant checkpoint (which keeps the CPU RNG state itself), and the config keeps megatron-core's own fields,
checked by its ``TransformerConfig``:

- ``recompute_method='uniform'``: the layers in groups of ``recompute_num_layers``; only each group's input is kept
  for the backward, which runs the group's forward again;
- ``recompute_method='block'``: the first ``recompute_num_layers`` layers each recomputed alone, the rest stored as
  usual.

Only training forwards recompute (megatron-core's rule): a frozen reference or an ``eval()`` model stores nothing.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

logger = logging.getLogger(__name__)


def recompute_spans(method: str, group_size: int, num_layers: int) -> list[tuple[int, int, bool]]:
    """The decoder's layers as ``(start, end, recomputed)`` spans, in order, for megatron-core's two methods.

    Args:
        method: ``"uniform"`` or ``"block"``.
        group_size: ``recompute_num_layers``.
        num_layers: the layers of this pipeline stage.

    Raises:
        ValueError: another method, or a group size below 1.
    """
    if group_size < 1:
        raise ValueError(f"recompute_num_layers must be >= 1, got {group_size}.")
    if method == "uniform":
        return [(start, min(start + group_size, num_layers), True) for start in range(0, num_layers, group_size)]
    if method == "block":
        return [(index, index + 1, index < group_size) for index in range(num_layers)]
    raise ValueError(f"recompute_method must be 'uniform' or 'block', got {method!r}.")


def _checkpointed_forward(
    block: Any,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None,
    context: torch.Tensor | None,
    context_mask: torch.Tensor | None,
    rotary_pos_emb: torch.Tensor | None,
    attention_bias: torch.Tensor | None,
    packed_seq_params: Any,
    use_inner_quantization_context: bool = False,
    padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``TransformerBlock._checkpointed_forward`` for CPU: the same spans, torch's checkpoint around each."""
    del use_inner_quantization_context  # fp8 / fp4 contexts are CUDA (Transformer Engine) only

    def run_span(start: int, end: int):
        def forward(hidden: torch.Tensor, ctx: torch.Tensor | None):
            for index in range(start, end):
                hidden, ctx = block._get_layer(index)(
                    hidden_states=hidden,
                    attention_mask=attention_mask,
                    context=ctx,
                    context_mask=context_mask,
                    rotary_pos_emb=rotary_pos_emb,
                    attention_bias=attention_bias,
                    inference_context=None,
                    packed_seq_params=packed_seq_params,
                    padding_mask=padding_mask,
                )
            return hidden, ctx

        return forward

    config = block.config
    for start, end, recomputed in recompute_spans(
        config.recompute_method, config.recompute_num_layers, block.num_layers_per_pipeline_rank
    ):
        span = run_span(start, end)
        if recomputed:
            hidden_states, context = checkpoint(span, hidden_states, context, use_reentrant=False)
        else:
            hidden_states, context = span(hidden_states, context)
    return hidden_states


def recompute_on_cpu(model: torch.nn.Module) -> bool:
    """Give a CPU GPTModel's decoder megatron-core's full recomputation through torch's checkpoint.

    Args:
        model: a megatron-core ``GPTModel`` (its ``decoder`` is a ``TransformerBlock``).

    Returns:
        True when the config asks for full recomputation and the decoder now does it; False otherwise.

    Raises:
        ValueError: ``recompute_granularity='selective'`` (megatron-core recomputes single modules there through
            its CUDA RNG checkpoint; only ``full`` runs on CPU).
    """
    config = model.config
    if config.recompute_granularity is None:
        return False
    if config.recompute_granularity != "full":
        raise ValueError(
            f"recompute_granularity={config.recompute_granularity!r} recomputes single modules through "
            "megatron-core's CUDA RNG checkpoint, which needs CUDA; on CPU use 'full' (with recompute_method "
            "'uniform' or 'block'), or run with trainer.device=cuda."
        )
    model.decoder._checkpointed_forward = types.MethodType(_checkpointed_forward, model.decoder)
    logger.info(
        "activation recomputation on CPU: %s method, %d layer(s) per group, by torch.utils.checkpoint",
        config.recompute_method,
        config.recompute_num_layers,
    )
    return True
