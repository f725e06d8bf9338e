"""Rollout correction under verl's names: importance weights, rejection, and bypass mode.

The rollout engine samples from mu and reports log mu (``rollout_log_probs``); the trainer's old policy pi_old
gives ``old_log_probs``. With r = pi_old / mu per token:

- importance weights (:func:`compute_rollout_correction_weights`): r per token, or the product over each sequence on
  all its tokens, truncated at a bound (TIS, ``rollout_is_threshold: 2.0``) or zeroed outside a band (IcePop,
  ``"0.5_5.0"``), optionally divided by their batch mean; they multiply the policy loss;
- rejection (:func:`compute_rollout_rejection_mask`): tokens or whole sequences whose criterion (see
  :mod:`~verl.algorithms.rollout_corr_thresholds`) leaves its bounds leave ``response_mask``, and so the loss;
- both at once with every metric, prefixed ``rollout_corr/``
  (:func:`compute_rollout_correction_and_rejection_mask`, :func:`compute_rollout_correction_and_add_to_batch`);
- bypass mode (:func:`apply_bypass_mode`): the rollout's log-probs serve as the old ones, no old-log-prob pass, and
  the ``bypass_mode`` policy loss corrects against the current policy.

Metrics are in :mod:`~verl.algorithms.rollout_corr_metrics`; all three modules' public names are importable
from here, as from verl's module of the same name.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import torch

from verl.algorithms.algo_registry import read_key
from verl.algorithms.rollout_corr_metrics import compute_is_metrics, compute_offpolicy_metrics, compute_rs_metrics
from verl.algorithms.rollout_corr_thresholds import (
    SAFETY_BOUND,
    SUPPORTED_ROLLOUT_RS_OPTIONS,
    TOKEN_LEVEL_ROLLOUT_RS_OPTIONS,
    k1_log_bounds,
    parse_is_threshold,
    parse_rs_options,
    parse_rs_thresholds,
)
from verl.protocol import DataProto
from verl.utils.torch_functional import masked_mean, masked_sum

__all__ = [
    "SAFETY_BOUND",
    "SUPPORTED_ROLLOUT_RS_OPTIONS",
    "TOKEN_LEVEL_ROLLOUT_RS_OPTIONS",
    "apply_bypass_mode",
    "compute_is_metrics",
    "compute_offpolicy_metrics",
    "compute_rollout_corr_metrics_from_logprobs",
    "compute_rollout_correction_and_add_to_batch",
    "compute_rollout_correction_and_rejection_mask",
    "compute_rollout_correction_weights",
    "compute_rollout_rejection_mask",
    "compute_rs_metrics",
]


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: str | float = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights (B, R) from log r = log pi_old - log mu, detached, 0 on padding, and their metrics.

    Args:
        log_ratio: (B, R) log r.
        response_mask: (B, R) 0/1.
        rollout_is: ``token`` (w_t = r_t) or ``sequence`` (w = prod_t r_t on every token of the sequence).
        rollout_is_threshold: a number C (w = min(w, C)) or ``"lower_upper"`` (w kept inside the band, else 0).
        rollout_is_batch_normalize: divide by the mean weight (over valid tokens, or over sequences).

    Raises:
        ValueError: an unknown ``rollout_is`` or a bad threshold (``TypeError`` for a boolean).
    """
    if rollout_is not in ("token", "sequence"):
        raise ValueError(f"rollout_is={rollout_is!r} is not supported; use 'token', 'sequence' or null.")
    upper, lower = parse_is_threshold(rollout_is_threshold)
    if rollout_is == "token":
        log_ratio_for_metrics = log_ratio
        raw = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    else:
        log_ratio_for_metrics = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw = log_ratio_for_metrics.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().expand_as(log_ratio)
    raw = raw * response_mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    metrics = compute_is_metrics(weights, raw, log_ratio_for_metrics, response_mask, rollout_is, upper, lower)
    if lower is not None:
        outside = ((raw < lower) | (raw > upper)).float()
        metrics["rollout_is_oob_ratio"] = masked_mean(outside, response_mask).item()
    weights = weights.detach()  # a weight changes the measure, not the objective: no gradient through it
    if rollout_is_batch_normalize:
        weights, metrics["rollout_is_batch_norm_factor"] = _normalise(weights, response_mask, rollout_is)
    return weights, metrics


def _normalise(weights: torch.Tensor, response_mask: torch.Tensor, rollout_is: str) -> tuple[torch.Tensor, float]:
    if rollout_is == "token":
        mean = masked_mean(weights, response_mask)
    else:
        has_tokens = response_mask.sum(dim=-1) > 0
        mean = masked_mean(weights, response_mask, axis=-1)[has_tokens].mean()
    if not mean > 1e-8:
        return weights, 1.0
    return weights / mean, mean.item()


def _criterion(option: str, log_ratio: torch.Tensor, response_mask: torch.Tensor):
    """(per-token statistic (B, R), per-sequence statistic (B,) or None) of one rejection criterion."""
    kind = option.rsplit("_", 1)[1]
    if kind == "k1":
        per_token = -log_ratio
    elif kind == "k2":
        per_token = 0.5 * log_ratio.square()
    else:
        per_token = log_ratio.exp() - 1.0 - log_ratio
    if option in TOKEN_LEVEL_ROLLOUT_RS_OPTIONS:
        return per_token, None
    if option.startswith("seq_sum"):
        per_seq = masked_sum(per_token, response_mask, axis=-1)
    elif option.startswith("seq_mean"):
        per_seq = masked_mean(per_token, response_mask, axis=-1)
    else:  # seq_max: the largest over the valid tokens; 0 for a sequence without any
        filled = per_token.masked_fill(~response_mask.bool(), float("-inf")).max(dim=-1).values
        per_seq = torch.where(torch.isinf(filled), torch.zeros_like(filled), filled)
    return per_seq.unsqueeze(-1).expand_as(per_token), per_seq


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``response_mask`` with the tokens (or whole sequences) that fail any criterion of ``rollout_rs`` set to 0.

    Args:
        log_ratio: (B, R) log r = log pi_old - log mu.
        response_mask: (B, R) 0/1.
        rollout_rs: comma-separated criteria (``token_k1``, ``seq_sum_k3``, ``seq_max_k2``, ...); all must pass.
        rollout_rs_threshold: one threshold, or one per criterion; k1 takes ``lower_upper`` (bounds on mu / pi)
            or C (``1/C_C``), k2 and k3 an upper bound.

    Returns:
        (the mask (B, R), metrics: per criterion ``rollout_rs_<option>_*`` with ``_masked_fraction`` (tokens) and
        ``_seq_masked_fraction`` (sequences it rejected), and over all criteria ``rollout_rs_masked_fraction`` and
        ``rollout_rs_seq_masked_fraction``).

    Raises:
        ValueError: unknown criteria or thresholds that do not fit them.
    """
    options = parse_rs_options(rollout_rs)
    thresholds = parse_rs_thresholds(options, rollout_rs_threshold)
    if log_ratio.shape[0] == 0:
        return response_mask, {}
    log_ratio = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq_valid = response_mask.sum(dim=-1) > 0
    keep_all = torch.ones_like(response_mask.bool())
    metrics: dict[str, float] = {}
    for option in options:
        keep, option_metrics = _apply_rs_criterion(option, thresholds[option], log_ratio, response_mask, seq_valid)
        keep_all &= keep
        metrics.update(option_metrics)
    metrics.update(_rejected_fractions("rollout_rs", keep_all, response_mask, seq_valid))
    return (response_mask * keep_all).to(response_mask.dtype), metrics


def _apply_rs_criterion(
    option: str,
    bounds: tuple[float | None, float],
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    seq_valid: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Which tokens one rejection criterion keeps, and its ``rollout_rs_<option>_*`` metrics.

    Args:
        option: one parsed criterion, e.g. ``token_k1`` or ``seq_max_k2``.
        bounds: (lower, upper) from :func:`parse_rs_thresholds`; a lower bound is given only for k1.
        log_ratio: (B, R) clamped log r.
        response_mask: (B, R) 0/1.
        seq_valid: (B,) whether the sequence has a valid token.

    Returns:
        (keep: (B, R) bool, a sequence criterion's the same along each row; the criterion's metrics).
    """
    lower, upper = bounds
    statistic, per_seq = _criterion(option, log_ratio, response_mask)
    if lower is not None:  # k1: a band, compared in log space
        low_log, high_log = k1_log_bounds(lower, upper)
        keep = (statistic >= low_log) & (statistic <= high_log)
    else:
        low_log, high_log = 0.0, upper
        keep = statistic <= upper
    level = "token" if option in TOKEN_LEVEL_ROLLOUT_RS_OPTIONS else "sequence"
    metrics = compute_rs_metrics(
        option,
        statistic,
        response_mask,
        seq_valid,
        level=level,
        per_sequence_values=per_seq,
        rollout_rs_threshold=high_log,
        rollout_rs_threshold_lower=low_log,
        apply_lower_threshold=lower is not None,
    )
    metrics.update(_rejected_fractions(f"rollout_rs_{option}", keep, response_mask, seq_valid))
    return keep, metrics


def _rejected_fractions(
    prefix: str, keep: torch.Tensor, response_mask: torch.Tensor, seq_valid: torch.Tensor
) -> dict[str, float]:
    """``<prefix>_masked_fraction`` (valid tokens rejected) and ``<prefix>_seq_masked_fraction``.

    The sequence fraction counts a sequence as rejected when any of its valid tokens is, over the sequences that
    have a valid token (0.0 when none has).
    """
    rejected_seq = (~keep & response_mask.bool()).any(dim=-1)
    return {
        f"{prefix}_masked_fraction": masked_mean((~keep).float(), response_mask).item(),
        f"{prefix}_seq_masked_fraction": rejected_seq[seq_valid].float().mean().item() if seq_valid.any() else 0.0,
    }


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[DataProto | None, torch.Tensor, dict[str, float]]:
    """Importance weights, rejection and the off-policy metrics in one call; metrics prefixed ``rollout_corr/``.

    Args:
        old_log_prob, rollout_log_prob: (B, R) log pi_old and log mu.
        response_mask: (B, R) 0/1.
        rollout_is, rollout_is_threshold, rollout_is_batch_normalize: see
            :func:`compute_rollout_correction_weights`; ``rollout_is`` None computes no weights.
        rollout_rs, rollout_rs_threshold: see :func:`compute_rollout_rejection_mask`; None rejects nothing.

    Returns:
        (a DataProto holding ``rollout_is_weights`` (B, R), or None without ``rollout_is``; the mask after
        rejection (B, R), a new tensor; the metrics). The off-policy metrics are computed either way.

    Raises:
        ValueError: an empty mask, shapes that differ, or bad settings.
    """
    if not response_mask.any():
        raise ValueError("response_mask must hold at least one valid token (1); this batch has none.")
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob {tuple(rollout_log_prob.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have the same shape."
        )
    log_ratio = old_log_prob - rollout_log_prob
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    mask = response_mask.clone()
    if rollout_rs is not None:
        if rollout_rs_threshold is None:
            raise ValueError("rollout_rs_threshold must be set when rollout_rs is: one threshold per criterion.")
        mask, rs_metrics = compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    weights_proto = None if weights is None else DataProto.from_dict(tensors={"rollout_is_weights": weights})
    return weights_proto, mask, {f"rollout_corr/{key}": float(value) for key, value in metrics.items()}


def compute_rollout_correction_and_add_to_batch(batch: DataProto, rollout_corr_config: Any) -> tuple[DataProto, dict]:
    """Apply ``algorithm.rollout_correction`` to a batch with ``old_log_probs``, ``rollout_log_probs`` and
    ``response_mask``: the mask always becomes the one after rejection, ``rollout_is_weights`` is added when
    ``rollout_is`` is set. Returns (the batch, the ``rollout_corr/`` metrics).

    ``rollout_corr_config`` is the typed :class:`~verl.workers.config.RolloutCorrectionConfig` or a mapping with
    its keys (missing ones: no weights, threshold 2.0, no rejection).
    """
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=batch.batch["old_log_probs"],
        rollout_log_prob=batch.batch["rollout_log_probs"],
        response_mask=batch.batch["response_mask"],
        rollout_is=read_key(rollout_corr_config, "rollout_is", None),
        rollout_is_threshold=read_key(rollout_corr_config, "rollout_is_threshold", 2.0),
        rollout_is_batch_normalize=read_key(rollout_corr_config, "rollout_is_batch_normalize", False),
        rollout_rs=read_key(rollout_corr_config, "rollout_rs", None),
        rollout_rs_threshold=read_key(rollout_corr_config, "rollout_rs_threshold", None),
    )
    batch.batch["response_mask"] = mask
    if weights is not None:
        batch = batch.union(weights)
    return batch, metrics


def compute_rollout_corr_metrics_from_logprobs(
    log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """The off-policy metrics of the current policy's log-probs (B, R) against the rollout's, ``rollout_corr/``."""
    metrics = compute_offpolicy_metrics(log_prob, rollout_log_prob, response_mask)
    return {f"rollout_corr/{key}": float(value) for key, value in metrics.items()}


def apply_bypass_mode(batch: DataProto, rollout_corr_config: Any = None, policy_loss_config: Any = None) -> None:
    """Bypass mode on a batch: the rollout's log-probs become ``old_log_probs`` (no old-log-prob pass).

    As in verl, a mutable ``policy_loss_config`` (a dict or a DictConfig) also gets ``loss_mode: bypass_mode`` and
    ``rollout_correction``, so that the loss corrects against the current policy. This project's trainer does not
    need that: its typed config is frozen, and it hands the settings to the actor in
    ``meta_info["rollout_correction"]`` instead.

    Raises:
        ValueError: the batch has no ``rollout_log_probs``, or ``policy_loss_config`` cannot be changed.
    """
    if "rollout_log_probs" not in batch.batch.keys():
        raise ValueError(
            "bypass mode uses the rollout's log-probs as the old ones, and this batch has no rollout_log_probs; "
            "every rollout here returns them, so the batch did not come from a rollout."
        )
    batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
    if policy_loss_config is None:
        return
    if not isinstance(policy_loss_config, MutableMapping):
        try:
            from omegaconf import DictConfig, open_dict
        except ImportError:  # pragma: no cover - omegaconf is a dependency
            DictConfig = ()
        if not isinstance(policy_loss_config, DictConfig):
            raise ValueError(
                "apply_bypass_mode cannot change a frozen policy-loss config; pass a dict or a DictConfig, or let "
                "the trainer pass algorithm.rollout_correction to the actor (it does with bypass_mode=true)."
            )
        with open_dict(policy_loss_config):
            policy_loss_config["rollout_correction"] = rollout_corr_config
            policy_loss_config["loss_mode"] = "bypass_mode"
        return
    policy_loss_config["rollout_correction"] = rollout_corr_config
    policy_loss_config["loss_mode"] = "bypass_mode"
