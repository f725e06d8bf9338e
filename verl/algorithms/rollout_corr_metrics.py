"""What rollout correction logs: importance-weight, rejection and off-policy statistics, under verl's names.

Three families, returned without the ``rollout_corr/`` prefix that
:func:`~verl.algorithms.rollout_corr_helper.compute_rollout_correction_and_rejection_mask` adds:

- :func:`compute_is_metrics`: ``rollout_is_mean`` / ``_max`` / ``_min`` / ``_std``, ``rollout_is_eff_sample_size``,
  ``rollout_is_ratio_fraction_high`` / ``_low`` (weights beyond the bounds before truncation) and the per-sequence
  ``rollout_is_seq_*``;
- :func:`compute_rs_metrics`: per rejection criterion, ``rollout_rs_<option>_mean`` and its siblings;
- :func:`compute_offpolicy_metrics`: ``training_ppl``, ``rollout_ppl``, ``ppl_ratio``, ``kl``, ``k3_kl``,
  ``log_ppl_diff``, ``chi2_token``, ``chi2_seq`` and the like, the gap between the trainer (pi) and the rollout
  engine (mu).

Shapes: (B, R) tensors with a (B, R) 0/1 ``response_mask``. A sequence without a response token is left out of
every per-sequence statistic.
"""

from __future__ import annotations

import math

import torch

from verl.algorithms.rollout_corr_thresholds import SAFETY_BOUND
from verl.utils.torch_functional import masked_mean, masked_sum


def _require_tokens(response_mask: torch.Tensor) -> None:
    if not response_mask.any():
        raise ValueError("response_mask must hold at least one valid token (1); this batch has none.")


def _clamped_std(values: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> float:
    """Population std of the masked values clamped to [low, high] (outliers would swamp it); 0 for one token."""
    if mask.sum() <= 1:
        return 0.0
    clamped = values.clamp(min=low, max=high)
    mean = masked_mean(clamped, mask)
    return torch.sqrt((masked_mean(clamped.square(), mask) - mean.square()).clamp(min=0.0)).item()


def _masked_extremes(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    valid = mask.bool()
    return values[valid].max().item(), values[valid].min().item()


def _summary(values: torch.Tensor) -> tuple[float, float, float, float]:
    """(mean, sample std, max, min) of a 1-D tensor; std 0 for one value."""
    std = values.std().item() if values.numel() > 1 else 0.0
    return values.mean().item(), std, values.max().item(), values.min().item()


def compute_is_metrics(
    rollout_is_weights: torch.Tensor,
    raw_rollout_is_weights: torch.Tensor,
    log_ratio_for_metrics: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str,
    rollout_is_threshold: float,
    rollout_is_threshold_lower: float | None = None,
) -> dict[str, float]:
    """Statistics of the importance weights pi_old / mu (without prefix).

    Args:
        rollout_is_weights: (B, R) the weights applied (truncated, or zeroed outside the IcePop band).
        raw_rollout_is_weights: (B, R) the weights before truncation (0 on padding).
        log_ratio_for_metrics: (B, R) token log-ratios, or (B, 1) sequence sums at ``rollout_is="sequence"``.
        response_mask: (B, R) 0/1.
        rollout_is: ``token`` or ``sequence``.
        rollout_is_threshold: the upper bound.
        rollout_is_threshold_lower: the lower bound of a band; None means 1 / upper for the ``_low`` fractions.

    Raises:
        ValueError: an empty ``response_mask``.
    """
    _require_tokens(response_mask)
    lower = 1.0 / rollout_is_threshold if rollout_is_threshold_lower is None else rollout_is_threshold_lower
    metrics = {"rollout_is_mean": masked_mean(rollout_is_weights, response_mask).item()}
    if rollout_is == "sequence":
        seq_log_ratio = log_ratio_for_metrics.reshape(-1)
        metrics["rollout_is_max"] = torch.exp(seq_log_ratio.max().clamp(max=SAFETY_BOUND)).item()
        metrics["rollout_is_min"] = torch.exp(seq_log_ratio.min()).item()
        # compared in log space: the product of many ratios overflows long before its log does
        metrics["rollout_is_ratio_fraction_high"] = (
            (seq_log_ratio > math.log(rollout_is_threshold)).float().mean().item()
        )
        metrics["rollout_is_ratio_fraction_low"] = (seq_log_ratio < math.log(lower)).float().mean().item()
    else:
        metrics["rollout_is_max"], metrics["rollout_is_min"] = _masked_extremes(rollout_is_weights, response_mask)
        high = (raw_rollout_is_weights > rollout_is_threshold).float()
        metrics["rollout_is_ratio_fraction_high"] = masked_mean(high, response_mask).item()
        low = (raw_rollout_is_weights < lower).float()
        metrics["rollout_is_ratio_fraction_low"] = masked_mean(low, response_mask).item()
    metrics["rollout_is_std"] = _clamped_std(rollout_is_weights, response_mask, 0.0, rollout_is_threshold)
    # Kish's effective sample size as a share of the tokens: 1 / E[(w / E[w])^2]
    bounded = rollout_is_weights.clamp(min=0.0, max=rollout_is_threshold)
    normalised = bounded / (masked_mean(bounded, response_mask) + 1e-8)
    metrics["rollout_is_eff_sample_size"] = 1.0 / masked_mean(normalised.square(), response_mask).item()
    has_tokens = response_mask.sum(dim=-1) > 0
    seq_means = masked_mean(rollout_is_weights, response_mask, axis=-1)[has_tokens]
    mean, std, high_value, low_value = _summary(seq_means)
    metrics.update(
        rollout_is_seq_mean=mean, rollout_is_seq_std=std, rollout_is_seq_max=high_value, rollout_is_seq_min=low_value
    )
    metrics["rollout_is_seq_max_deviation"] = (seq_means - 1.0).abs().max().item()
    # before truncation: a truncated weight never exceeds the bound, so its mean could not either
    raw_seq_means = masked_mean(raw_rollout_is_weights, response_mask, axis=-1)[has_tokens]
    metrics["rollout_is_seq_fraction_high"] = (raw_seq_means > rollout_is_threshold).float().mean().item()
    metrics["rollout_is_seq_fraction_low"] = (raw_seq_means < lower).float().mean().item()
    return metrics


def compute_rs_metrics(
    option_name: str,
    rs_statistic: torch.Tensor,
    response_mask: torch.Tensor,
    seq_valid_mask: torch.Tensor,
    *,
    level: str,
    per_sequence_values: torch.Tensor | None,
    rollout_rs_threshold: float,
    rollout_rs_threshold_lower: float,
    apply_lower_threshold: bool,
) -> dict[str, float]:
    """Statistics of one rejection criterion, named ``rollout_rs_<option_name>_*`` (without the global prefix).

    Args:
        option_name: the criterion (``token_k1``, ``seq_mean_k3``, ...).
        rs_statistic: (B, R) the value compared with the thresholds (a sequence's value on each of its tokens).
        response_mask: (B, R) 0/1.
        seq_valid_mask: (B,) sequences with at least one valid token.
        level: ``token`` or ``sequence``.
        per_sequence_values: (B,) the sequence values of a sequence criterion; None: token means.
        rollout_rs_threshold: the upper bound (in log space for k1).
        rollout_rs_threshold_lower: the lower bound (k1, in log space; else unused).
        apply_lower_threshold: whether the criterion has a lower bound (k1).

    Raises:
        ValueError: an empty ``response_mask``.
    """
    _require_tokens(response_mask)
    prefix = f"rollout_rs_{option_name}"
    if per_sequence_values is None:
        per_sequence_values = masked_mean(rs_statistic, response_mask, axis=-1)
    seq_values = per_sequence_values.reshape(-1)[seq_valid_mask]
    upper, lower = rollout_rs_threshold, rollout_rs_threshold_lower
    metrics = {f"{prefix}_mean": masked_mean(rs_statistic, response_mask).item()}
    if level == "sequence":
        metrics[f"{prefix}_max"], metrics[f"{prefix}_min"] = seq_values.max().item(), seq_values.min().item()
        metrics[f"{prefix}_fraction_high"] = (seq_values > upper).float().mean().item()
        low = (seq_values < lower).float().mean().item() if apply_lower_threshold else 0.0
    else:
        metrics[f"{prefix}_max"], metrics[f"{prefix}_min"] = _masked_extremes(rs_statistic, response_mask)
        metrics[f"{prefix}_fraction_high"] = masked_mean((rs_statistic > upper).float(), response_mask).item()
        low = masked_mean((rs_statistic < lower).float(), response_mask).item() if apply_lower_threshold else 0.0
    metrics[f"{prefix}_fraction_low"] = low
    metrics[f"{prefix}_std"] = _clamped_std(rs_statistic, response_mask, lower if apply_lower_threshold else 0.0, upper)
    mean, std, high_value, low_value = _summary(seq_values)
    metrics.update(
        {
            f"{prefix}_seq_mean": mean,
            f"{prefix}_seq_std": std,
            f"{prefix}_seq_max": high_value,
            f"{prefix}_seq_min": low_value,
            f"{prefix}_seq_max_deviation": seq_values.abs().max().item(),  # every criterion is ideally 0
            f"{prefix}_seq_fraction_high": (seq_values > upper).float().mean().item(),
        }
    )
    if apply_lower_threshold:
        metrics[f"{prefix}_seq_fraction_low"] = (seq_values < lower).float().mean().item()
    return metrics


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor | None, response_mask: torch.Tensor
) -> dict[str, float]:
    """The gap between the trainer's log-probs (pi) and the rollout engine's (mu), without prefix.

    ``training_ppl`` / ``rollout_ppl``: the mean over sequences of exp(-token mean of the log-probs);
    ``*_log_ppl`` the same without exp. With r = pi / mu per token: ``kl`` = mean of log mu - log pi (k1 of
    KL(mu || pi)), ``k3_kl`` = mean of r - 1 - log r; per sequence, d = token mean of log mu - token mean of log pi
    = log(ppl_pi / ppl_mu), and ``log_ppl_diff`` (mean of d), ``log_ppl_abs_diff``, ``log_ppl_diff_max`` / ``_min``,
    ``ppl_ratio`` (mean of exp d); ``chi2_token`` = E[r^2] - 1 over tokens, ``chi2_seq`` = E[(prod_t r_t)^2] - 1
    over sequences.

    Args:
        old_log_prob: (B, R) log pi.
        rollout_log_prob: (B, R) log mu, or None (then only the training perplexity).
        response_mask: (B, R) 0/1.

    Raises:
        ValueError: an empty ``response_mask``.
    """
    _require_tokens(response_mask)
    has_tokens = response_mask.sum(dim=-1) > 0
    pi_seq_mean = masked_mean(old_log_prob, response_mask, axis=-1)[has_tokens]
    metrics = {
        "training_ppl": torch.exp(-pi_seq_mean).mean().item(),
        "training_log_ppl": (-pi_seq_mean).mean().item(),
    }
    if rollout_log_prob is None:
        return metrics
    mu_seq_mean = masked_mean(rollout_log_prob, response_mask, axis=-1)[has_tokens]
    log_ratio = (old_log_prob - rollout_log_prob).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq_diff = mu_seq_mean - pi_seq_mean
    seq_log_ratio = masked_sum(log_ratio, response_mask, axis=-1)[has_tokens].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    metrics.update(
        {
            "kl": masked_mean(rollout_log_prob - old_log_prob, response_mask).item(),
            "k3_kl": masked_mean(log_ratio.exp() - log_ratio - 1.0, response_mask).item(),
            "rollout_ppl": torch.exp(-mu_seq_mean).mean().item(),
            "rollout_log_ppl": (-mu_seq_mean).mean().item(),
            "log_ppl_diff": seq_diff.mean().item(),
            "log_ppl_abs_diff": seq_diff.abs().mean().item(),
            "log_ppl_diff_max": seq_diff.max().item(),
            "log_ppl_diff_min": seq_diff.min().item(),
            "ppl_ratio": seq_diff.exp().mean().item(),
            "chi2_token": masked_mean(log_ratio.exp().square(), response_mask).item() - 1.0,
            "chi2_seq": (2.0 * seq_log_ratio).exp().mean().item() - 1.0,
        }
    )
    return metrics
