"""Log-probs of chosen tokens and entropy from the last hidden states and the output projection, chunk by chunk.

The plain path computes the logits of every response token at once, a (tokens, vocab) tensor (2k tokens of a
152k vocabulary: 1.2 GB in fp32), then its fp32 log-softmax and softmax copies for the log-probs and the entropy,
and autograd keeps them for the backward pass. :func:`linear_log_probs_and_entropy` instead takes the hidden states
(tokens, hidden) and the projection (vocab, hidden) and handles ``chunk_rows`` tokens at a time: the forward pass
keeps only each token's log-sum-exp, log-prob and entropy, and the backward pass recomputes each chunk's logits
from the saved hidden states to form the gradient. Peak memory is then a few (chunk_rows, vocab) fp32 buffers,
whatever the number of tokens. The numbers are the plain path's: the same products in the same compute dtype
(autocast's, under mixed precision), the same fp32 softmax and temperature; only the order of the weight
gradient's additions over chunks differs. This is verl's ``model.use_fused_kernels`` with
``fused_kernel_options.impl_backend: torch`` (verl's Triton kernel is not provided here).
"""

from __future__ import annotations

import torch

FUSED_KERNEL_BACKENDS = ("torch",)
# fp32 elements of one chunk's (rows, vocab) logits: 2**25 (128 MiB) keeps the working set a few hundred MiB at any
# vocabulary while the chunk's products stay large enough to run at full matrix-product speed
_CHUNK_ELEMENTS = 2**25


def chunk_rows_for_vocab(vocab_size: int) -> int:
    """Tokens per chunk for a vocabulary of ``vocab_size``: as many as fit ``2**25`` fp32 logits (at least 1)."""
    return max(1, _CHUNK_ELEMENTS // max(1, vocab_size))


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the output projection runs in: autocast's under mixed precision, else the inputs' common dtype."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)


class _LinearLogProbEntropy(torch.autograd.Function):
    """Chunked ``log_softmax(hidden @ weight.T / T)[label]`` and entropy, recomputing each chunk in backward."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, chunk_rows, with_entropy, compute_dtype):
        num_tokens = hidden.shape[0]
        log_probs = hidden.new_empty(num_tokens, dtype=torch.float32)
        log_z = hidden.new_empty(num_tokens, dtype=torch.float32)
        entropy = hidden.new_empty(num_tokens if with_entropy else 0, dtype=torch.float32)
        with torch.autocast(hidden.device.type, enabled=False):
            weight_c = weight.to(compute_dtype)
            for start in range(0, num_tokens, chunk_rows):
                rows = slice(start, start + chunk_rows)
                logits = (hidden[rows].to(compute_dtype) @ weight_c.T).float()
                if temperature != 1.0:
                    logits.div_(temperature)
                chunk_log_z = logits.logsumexp(dim=-1)
                log_z[rows] = chunk_log_z
                log_probs[rows] = logits.gather(-1, labels[rows, None]).squeeze(-1) - chunk_log_z
                if with_entropy:
                    probs = (logits - chunk_log_z[:, None]).exp_()
                    entropy[rows] = chunk_log_z - (probs * logits).sum(dim=-1)
        ctx.save_for_backward(hidden, weight, labels, log_z, entropy)
        ctx.temperature, ctx.chunk_rows, ctx.with_entropy, ctx.compute_dtype = (
            temperature,
            chunk_rows,
            with_entropy,
            compute_dtype,
        )
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        hidden, weight, labels, log_z, entropy = ctx.saved_tensors
        temperature, chunk_rows, dtype = ctx.temperature, ctx.chunk_rows, ctx.compute_dtype
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        # fp32 accumulation over chunks: one rounding at the end, as the plain path's single product has
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        with torch.autocast(hidden.device.type, enabled=False):
            weight_c = weight.to(dtype)
            for start in range(0, hidden.shape[0], chunk_rows):
                rows = slice(start, start + chunk_rows)
                hidden_c = hidden[rows].to(dtype)
                log_p = (hidden_c @ weight_c.T).float()
                if temperature != 1.0:
                    log_p.div_(temperature)
                log_p.sub_(log_z[rows, None])
                probs = log_p.exp()
                g_lp = grad_log_probs[rows, None].float()
                # d log p_label / dz_j = [j = label] - p_j;  d H / dz_j = -p_j (log p_j + H)
                if ctx.with_entropy:
                    factor = log_p.add_(entropy[rows, None]).mul_(grad_entropy[rows, None].float()).add_(g_lp)
                else:
                    factor = g_lp
                grad_z = probs.mul_(factor).neg_()
                grad_z.scatter_add_(-1, labels[rows, None], g_lp)
                if temperature != 1.0:
                    grad_z.div_(temperature)
                grad_z = grad_z.to(dtype)
                if grad_hidden is not None:
                    grad_hidden[rows] = (grad_z @ weight_c).to(hidden.dtype)
                if ctx.needs_input_grad[1]:
                    grad_weight += (grad_z.T @ hidden_c).float()
        grad_weight = grad_weight.to(weight.dtype) if ctx.needs_input_grad[1] else None
        return grad_hidden, grad_weight, None, None, None, None, None


def linear_log_probs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_softmax(hidden @ weight.T / temperature)`` at ``labels`` (and the entropy), without the whole logits.

    Args:
        hidden: (N, H) last hidden states (after the final norm), any float dtype.
        weight: (V, H) the output projection (``lm_head.weight``; no bias).
        labels: (N,) int64 token ids in [0, V).
        temperature: the logits are divided by it (> 0).
        calculate_entropy: also return the entropy of each row's distribution.
        chunk_rows: tokens per chunk; None: :func:`chunk_rows_for_vocab` of V.

    Returns:
        (log_probs (N,) float32, entropy (N,) float32 or None); both differentiable w.r.t. ``hidden`` and ``weight``.
    """
    assert hidden.dim() == 2 and weight.dim() == 2 and hidden.shape[1] == weight.shape[1], (hidden.shape, weight.shape)
    assert temperature > 0, temperature
    rows = chunk_rows_for_vocab(weight.shape[0]) if chunk_rows is None else chunk_rows
    log_probs, entropy = _LinearLogProbEntropy.apply(
        hidden, weight, labels, float(temperature), rows, calculate_entropy, _compute_dtype(hidden, weight)
    )
    return log_probs, entropy if calculate_entropy else None


def response_log_probs_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    input_ids: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of the response tokens from full-sequence hidden states: the fused counterpart of
    :func:`verl.utils.torch_functional.compute_response_log_probs`.

    Args:
        hidden: (B, S, H) last hidden states; position t predicts token t + 1.
        weight: (V, H) the output projection.
        input_ids: (B, S) tokens whose last ``response_length`` positions are the response.
        response_length: R.
        temperature: the rollout's sampling temperature (0, greedy, takes the log-probs at 1, see
            :func:`verl.utils.torch_functional.log_prob_temperature`).
        calculate_entropy: also return the entropy of each predictive distribution.
        chunk_rows: tokens per chunk (None: from the vocabulary size).

    Returns:
        (log_probs (B, R) float32, entropy (B, R) float32 or None)
    """
    from verl.utils.torch_functional import log_prob_temperature

    batch, seq_len, hidden_size = hidden.shape
    response_hidden = hidden[:, seq_len - response_length - 1 : seq_len - 1, :].reshape(-1, hidden_size)
    labels = input_ids[:, seq_len - response_length :].reshape(-1)
    log_probs, entropy = linear_log_probs_and_entropy(
        response_hidden, weight, labels, log_prob_temperature(temperature), calculate_entropy, chunk_rows
    )
    shape = (batch, response_length)
    return log_probs.view(shape), None if entropy is None else entropy.view(shape)
