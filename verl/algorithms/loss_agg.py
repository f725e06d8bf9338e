"""Loss aggregation and the losses every trainer shares: entropy and the clipped value loss.

:func:`agg_loss` turns a per-token loss (B, R) into the scalar that is back-propagated; every policy loss ends with
it. Its normalisers (``batch_num_tokens``, ``global_batch_size``, ``dp_size``) let a rank divide by the size of the
whole data-parallel batch, so the averaged gradient equals the global mean. Re-exported by
:mod:`verl.algorithms.core_algos` under verl's names.
"""

from __future__ import annotations

import torch

from verl.utils.torch_functional import entropy_from_logits, masked_mean, masked_sum

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss (B, R) into a scalar.

    Modes (``n_tok`` = valid tokens, ``n_seq`` = sequences with at least one valid token):

    - ``token-mean``: sum of valid token losses / ``batch_num_tokens`` (default: this batch's ``n_tok``).
    - ``token-sum``: sum of valid token losses (times ``dp_size``, so the averaged gradient is the global sum).
    - ``seq-mean-token-sum``: per-sequence sums, summed / ``global_batch_size`` (default: this batch's ``n_seq``).
    - ``seq-mean-token-mean``: per-sequence means, summed / ``global_batch_size`` (default ``n_seq``).
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): the sum of all valid token losses / ``loss_scale_factor``
      (default R, the padded length); note there is no division by the number of sequences.

    The first four are multiplied by ``dp_size``: when ``batch_num_tokens`` / ``global_batch_size`` count the
    whole data-parallel batch, the gradient averaging over ``dp_size`` ranks then yields the global mean. Fully
    masked sequences never count; an empty batch gives 0 instead of NaN.

    Args:
        loss_mat: (B, R) per-token losses.
        loss_mask: (B, R) 1 for tokens that count.
        loss_agg_mode: one of :data:`LOSS_AGG_MODES`.
        dp_size: data-parallel world size the normalisers refer to.
        batch_num_tokens: token count to divide by in ``token-mean``.
        global_batch_size: sequence count to divide by in the ``seq-mean-*`` modes.
        loss_scale_factor: divisor of ``seq-mean-token-sum-norm``; keep it constant over training.

    Raises:
        ValueError: for an unknown ``loss_agg_mode``.
    """
    if loss_agg_mode == "token-mean":
        denominator = loss_mask.sum().clamp(min=1e-8) if batch_num_tokens is None else batch_num_tokens
        return masked_sum(loss_mat, loss_mask) / denominator * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        seq_tokens = loss_mask.sum(dim=-1)
        seq_losses = (loss_mat * loss_mask).sum(dim=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            seq_losses = seq_losses / (seq_tokens + 1e-8)
        seq_mask = (seq_tokens > 0).to(seq_losses.dtype)
        denominator = seq_mask.sum().clamp(min=1e-8) if global_batch_size is None else global_batch_size
        return masked_sum(seq_losses, seq_mask) / denominator * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        divisor = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        return (loss_mat * loss_mask).sum() / divisor
    raise ValueError(f"loss_agg_mode={loss_agg_mode!r} is not supported; use one of {list(LOSS_AGG_MODES)}.")


def loss_share(micro_mask: torch.Tensor, mini_mask: torch.Tensor, aggregation: str) -> float:
    """The weight of a micro-batch's loss in its mini-batch, under the loss's aggregation.

    A micro-batch's loss is normalised by its own count (tokens, sequences); scaled by its share of the mini-batch's
    count, the accumulated gradients equal those of the mini-batch's loss. ``token-mean`` shares by valid tokens,
    ``seq-mean-token-sum`` / ``seq-mean-token-mean`` by sequences with a valid token (the ones ``agg_loss``
    counts), ``row-mean`` by rows; ``token-sum`` and ``seq-mean-token-sum-norm`` divide by nothing that depends on
    the micro-batch (a sum, or a constant), so each micro-batch counts whole (1).

    Args:
        micro_mask: (b, R) the micro-batch's response mask.
        mini_mask: (B, R) the mini-batch's response mask.
        aggregation: an ``agg_loss`` mode or ``"row-mean"``.

    Raises:
        ValueError: an unknown aggregation.
    """
    if aggregation == "token-mean":
        return float(micro_mask.sum()) / max(float(mini_mask.sum()), 1.0)
    if aggregation in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return float((micro_mask.sum(-1) > 0).sum()) / max(float((mini_mask.sum(-1) > 0).sum()), 1.0)
    if aggregation == "row-mean":
        return micro_mask.shape[0] / max(mini_mask.shape[0], 1)
    if aggregation in ("token-sum", "seq-mean-token-sum-norm"):
        return 1.0
    raise ValueError(
        f"loss aggregation {aggregation!r} is not supported; use token-mean, token-sum, seq-mean-token-sum, "
        "seq-mean-token-mean, seq-mean-token-sum-norm (or row-mean for a loss that averages over rows)."
    )


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Mean categorical entropy of the response tokens, aggregated by ``loss_agg_mode``.

    Args:
        logits: (B, R, V).
        response_mask: (B, R).
    """
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss 0.5 * agg(max((v - G)^2, (clip(v, v_old +- c) - G)^2)).

    Args:
        vpreds: (B, R) new value predictions; returns: (B, R) targets; values: (B, R) old predictions.
        response_mask: (B, R).
        cliprange_value: how far a prediction may move from the old value before clipping.
        loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: passed to
            :func:`agg_loss`.

    Returns:
        ``(vf_loss, vf_clipfrac)``: the scalar loss and the fraction of tokens where the clipped term won.
    """
    clipped = values + (vpreds - values).clamp(-cliprange_value, cliprange_value)
    loss_unclipped = (vpreds - returns).square()
    loss_clipped = (clipped - returns).square()
    vf_loss = 0.5 * agg_loss(
        torch.maximum(loss_unclipped, loss_clipped),
        response_mask,
        loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    vf_clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac
