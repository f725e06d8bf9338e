"""Activation recomputation of a megatron-core decoder on CPU, by ``torch.utils.checkpoint``.

megatron-core recomputes through ``tensor_parallel.checkpoint``, which saves and restores the CUDA RNG state, so it
cannot run on a CPU-only torch. What it recomputes needs no CUDA, though: :func:`recompute_on_cpu` gives a CPU
model the same recomputation with torch's non-reentrant checkpoint (which keeps the CPU RNG state itself), and the
config keeps megatron-core's own fields, checked by its ``TransformerConfig``:

- ``recompute_granularity='full'``: whole layers, grouped by ``recompute_method``:

  - ``'uniform'``: the layers in groups of ``recompute_num_layers``; only each group's input is kept for the
    backward, which runs the group's forward again;
  - ``'block'``: the first ``recompute_num_layers`` layers each recomputed alone, the rest stored as usual.

- ``recompute_granularity='selective'``: the modules of each layer that ``recompute_modules`` names and
  megatron-core marked for recomputation when it built the layer (:data:`SELECTIVE_MODULES`: ``core_attn``,
  ``mlp``, ``layernorm`` of a dense layer); each keeps only its input and runs again in the backward.

Only training forwards with gradients recompute (megatron-core's rule): a frozen reference or an ``eval()`` model
stores nothing. Recomputation changes what is kept for the backward, never the numbers.
"""

from __future__ import annotations

import functools
import logging
import types
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

logger = logging.getLogger(__name__)

# Selective recomputation of a dense layer: (the part of the layer that holds megatron-core's flag, the flag it sets
# at construction from ``recompute_modules``, the module the flag recomputes). ``core_attn`` sets the first,
# ``mlp`` the second, ``layernorm`` the third (megatron-core sets the fourth for mixture-of-experts layers only).
SELECTIVE_MODULES: tuple[tuple[str | None, str, str], ...] = (
    ("self_attention", "checkpoint_core_attention", "core_attention"),
    (None, "recompute_mlp", "mlp"),
    (None, "recompute_input_layernorm", "input_layernorm"),
    (None, "recompute_pre_mlp_layernorm", "pre_mlp_layernorm"),
)


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


def _recomputed_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A module's own forward under torch's checkpoint while it trains with gradients (bound to the module, so a
    deep copy of the model rebinds it to the copy)."""
    forward = functools.partial(type(self).forward, self)
    if not (self.training and torch.is_grad_enabled()):
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def _recompute_selected_modules(model: torch.nn.Module) -> list[str]:
    """Move megatron-core's selective recomputation of each decoder layer onto torch's checkpoint: every flag it set
    is turned off and the module it names recomputes itself. Returns the recomputed modules' names (one layer's)."""
    names: list[str] = []
    for index, layer in enumerate(model.decoder.layers):
        for owner_name, flag, module_name in SELECTIVE_MODULES:
            owner = layer if owner_name is None else getattr(layer, owner_name, None)
            if owner is None or not getattr(owner, flag, False):
                continue
            setattr(owner, flag, False)  # megatron-core's CUDA path off, torch's checkpoint on
            module = getattr(owner, module_name)
            module.forward = types.MethodType(_recomputed_forward, module)
            if index == 0:
                names.append(module_name if owner_name is None else f"{owner_name}.{module_name}")
    return names


def recompute_on_cpu(model: torch.nn.Module) -> bool:
    """Give a CPU GPTModel's decoder megatron-core's recomputation through torch's checkpoint.

    Args:
        model: a megatron-core ``GPTModel`` (its ``decoder`` is a ``TransformerBlock``).

    Returns:
        True when the config asks for recomputation and the decoder now does it; False otherwise.
    """
    config = model.config
    if config.recompute_granularity is None:
        return False
    if config.recompute_granularity == "full":
        model.decoder._checkpointed_forward = types.MethodType(_checkpointed_forward, model.decoder)
        logger.info(
            "activation recomputation on CPU: %s method, %d layer(s) per group, by torch.utils.checkpoint",
            config.recompute_method,
            config.recompute_num_layers,
        )
        return True
    names = _recompute_selected_modules(model)
    logger.info(
        "activation recomputation on CPU: selective, recompute_modules=%s -> %s of each layer, by "
        "torch.utils.checkpoint",
        list(config.recompute_modules),
        ", ".join(names) or "nothing (no module of these layers is named)",
    )
    return True
