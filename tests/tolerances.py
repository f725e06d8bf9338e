"""Tolerances derived from floating-point arithmetic, for tests that compare two computations of the same numbers.

Two computations that differ only in the order of their additions (another kernel, a fused product, a key/value cache
instead of a full recompute) round differently, and the order a kernel picks can change with the machine (its vector
width, its thread count). A sum of ``n`` terms in any order is within ``n * u * sum|terms|`` of the exact sum (``u``,
the unit roundoff, is half of ``torch.finfo(dtype).eps``), so two orders are within ``n * eps * sum|terms|`` of each
other. A decoder's logit goes through a chain of such sums (norms, projections, attention); through a normalised
network an error passes each stage about unamplified, so the chain's errors add up, relative to the scale of the
values: ``eps * (sum of the chain's reduction lengths) * max|logits|``. In float32 that is a few 1e-4 on the tiny
test models' logits of about 5, four orders of magnitude below what a real defect (a skipped module, a wrong
position) changes.
"""

from __future__ import annotations

import torch

__all__ = [
    "assert_gradients_close",
    "decoder_reduction_length",
    "fp16_logits_tolerance",
    "logits_tolerance",
    "reordering_tolerance",
]

FP32_EPS = torch.finfo(torch.float32).eps  # 2**-23
FP16_EPS = torch.finfo(torch.float16).eps  # 2**-10

# fp16 operations on one logit's path per decoder layer, each rounding its result to fp16 (under autocast): four
# products (query/key/value, output, gate/up, down), three in the attention (scores, softmax, weighted sum), three
# in the rotary embedding (two products and their sum), and two in the MLP (SiLU, times up).
NUM_FP16_OPS_PER_LAYER = 12


def reordering_tolerance(reference: torch.Tensor, num_terms: int, eps: float = FP32_EPS) -> float:
    """How far two computations of ``reference`` may differ when only their order of additions differs:
    ``num_terms * eps * max|reference|``, ``num_terms`` the summed lengths of the reductions along the way."""
    return float(num_terms * eps * reference.detach().abs().max())


def decoder_reduction_length(config, num_positions: int) -> int:
    """The summed lengths of the reductions one logit of a Llama-family decoder goes through.

    Per layer: two RMSNorms and the query/key/value and gate/up products over ``hidden_size`` (4x), the per-head
    q/k norm and the attention scores over ``head_dim`` (2x), the softmax and the weighted sum over the
    ``num_positions`` positions (2x), the output product over ``num_heads * head_dim`` and the down product over
    ``intermediate_size``; then the final norm and the LM head over ``hidden_size`` (2x).

    Args:
        config: a Hugging Face config of a Llama-family model.
        num_positions: the most positions a query attends to.
    """
    hidden = int(config.hidden_size)
    num_heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // num_heads)
    per_layer = 4 * hidden + 2 * head_dim + 2 * num_positions + num_heads * head_dim + int(config.intermediate_size)
    return int(config.num_hidden_layers) * per_layer + 2 * hidden


def logits_tolerance(reference: torch.Tensor, config, num_positions: int) -> float:
    """Absolute tolerance on float32 logits that only a different order of additions separates from ``reference``
    (see the module docstring)."""
    return reordering_tolerance(reference, decoder_reduction_length(config, num_positions))


def fp16_logits_tolerance(reference: torch.Tensor, config, num_positions: int) -> float:
    """Absolute tolerance on logits computed under fp16 autocast by two decoders that run the same fp16 operations
    with another order of (fp32) accumulation.

    A different accumulation order can tip the fp16 rounding of an operation's result by one unit in the last place,
    a relative ``FP16_EPS``; each fp16 operation on a logit's path (:data:`NUM_FP16_OPS_PER_LAYER` per layer, plus
    the LM head) can add one, on top of the float32 reordering bound of :func:`logits_tolerance`.
    """
    num_fp16_ops = int(config.num_hidden_layers) * NUM_FP16_OPS_PER_LAYER + 1
    return reordering_tolerance(reference, num_fp16_ops, FP16_EPS) + logits_tolerance(reference, config, num_positions)


def assert_gradients_close(reference: torch.nn.Module, other: torch.nn.Module, num_positions: int) -> None:
    """The gradients left on two decoders' parameters by one update agree within the reordering bound.

    Compare gradients, not the updated weights: a first AdamW step moves each weight by about lr * sign(gradient),
    so two gradients within rounding of zero can put the weights 2 * lr apart whatever the tolerance. The backward
    pass runs the forward's reductions again, transposed: twice the forward's reduction length, relative to each
    gradient's own scale.
    """
    num_terms = 2 * decoder_reduction_length(reference.config, num_positions)
    for (name, a), b in zip(reference.named_parameters(), other.parameters()):
        assert a.grad is not None and b.grad is not None, f"{name} has no gradient"
        torch.testing.assert_close(b.grad, a.grad, atol=reordering_tolerance(a.grad, num_terms), rtol=0, msg=name)
