"""Ratio-based policy losses: PPO-clip (``vanilla``), GSPO, GMPO (``geo_mean``), CISPO and SAPO.

Every registered loss is called as ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=...,
config=<actor config>, rollout_is_weights=None)`` with (B, R) tensors and returns ``(loss, metrics)``: a scalar and
a dict of floats named without the role prefix (the actor adds ``actor/``). The losses read their settings from
the actor config by attribute, as verl's do: ``clip_ratio``, ``clip_ratio_low`` / ``clip_ratio_high`` (null ->
``clip_ratio``), ``clip_ratio_c``, ``tau_pos`` / ``tau_neg``, ``loss_scale_factor``, ``policy_loss.*`` (see
:mod:`verl.algorithms.algo_registry`). Losses that aggregate their own way are listed in
:data:`~verl.algorithms.algo_registry.FIXED_LOSS_AGGREGATION`. ``rollout_is_weights`` multiply the per-token
loss before aggregation.
The other losses are in :mod:`verl.algorithms.pg_losses` and :mod:`verl.algorithms.cov_losses`.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.algo_registry import (
    FIXED_LOSS_AGGREGATION,
    POLICY_LOSS_REGISTRY,
    actor_option,
    clip_bounds,
    global_batch_info,
)
from verl.algorithms.loss_agg import agg_loss
from verl.utils.torch_functional import masked_mean

register = POLICY_LOSS_REGISTRY.register
FIXED_LOSS_AGGREGATION.update({"gspo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean", "geo_mean": "row-mean"})

# log-ratios are clamped before exp() so that a token whose probability moved a lot keeps a finite ratio
LOG_RATIO_BOUND = 20.0


def clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """(B, R) log(pi / pi_old), clamped to [-20, 20]."""
    return (log_prob - old_log_prob).clamp(min=-LOG_RATIO_BOUND, max=LOG_RATIO_BOUND)


def weighted_agg(
    per_token: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """Apply the rollout importance weights, then :func:`agg_loss` with the config's global batch normalisers."""
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights
    return agg_loss(per_token, response_mask, loss_agg_mode, **global_batch_info(config))


def _clipped_surrogate(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token dual-clip PPO loss (B, R) and its (pg_clipfrac, ppo_kl, pg_clipfrac_lower) scalars."""
    if not clip_ratio_c > 1.0:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_c must be > 1.0, got {clip_ratio_c}.")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    ppo_kl = masked_mean(-log_ratio, response_mask)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    clip_loss = torch.maximum(unclipped, clipped)
    pg_clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), response_mask)
    # dual clip: for A < 0 a huge ratio would make the loss unbounded; cap it at -A * c
    dual_bound = -advantages * clip_ratio_c
    dual_loss = torch.minimum(dual_bound, clip_loss)
    pg_clipfrac_lower = masked_mean((torch.gt(clip_loss, dual_bound) & (advantages < 0)).float(), response_mask)
    per_token = torch.where(advantages < 0, dual_loss, clip_loss)
    return per_token, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float | None = None,
    cliprange_low: float | None = None,
    cliprange_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate with dual clip for negative advantages, from explicit clip settings.

    verl keeps this form for backward compatibility; the registered loss (:func:`compute_policy_loss_vanilla`)
    reads the same settings from the actor config.

    Args:
        old_log_prob, log_prob, advantages, response_mask: (B, R).
        cliprange: symmetric clip range (default for both sides); cliprange_low / cliprange_high override a side.
        clip_ratio_c: dual-clip bound (> 1): for A < 0 the loss is capped at -A * clip_ratio_c.
        loss_agg_mode: see :func:`agg_loss`.

    Returns:
        (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower) scalars.

    Raises:
        ValueError: when a clip side is unset, or ``clip_ratio_c <= 1``.
    """
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    if low is None or high is None:
        raise ValueError("compute_policy_loss needs cliprange or both cliprange_low and cliprange_high.")
    per_token, clipfrac, ppo_kl, clipfrac_lower = _clipped_surrogate(
        old_log_prob, log_prob, advantages, response_mask, low, high, clip_ratio_c
    )
    return agg_loss(per_token, response_mask, loss_agg_mode), clipfrac, ppo_kl, clipfrac_lower


@register("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The registered PPO-clip loss (dual clip for negative advantages).

    Args:
        old_log_prob, log_prob, advantages, response_mask: (B, R).
        loss_agg_mode: see :func:`agg_loss`.
        config: the actor config; read as attributes: ``clip_ratio``, ``clip_ratio_low`` / ``clip_ratio_high``
            (None -> ``clip_ratio``) and ``clip_ratio_c``.
        rollout_is_weights: optional (B, R) importance weights multiplying each token's loss.

    Returns:
        ``(pg_loss, {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"})``.

    Raises:
        ValueError: without a config, or with ``clip_ratio_c <= 1``.
    """
    low, high = clip_bounds(config, "vanilla")
    per_token, clipfrac, ppo_kl, clipfrac_lower = _clipped_surrogate(
        old_log_prob, log_prob, advantages, response_mask, low, high, float(config.clip_ratio_c)
    )
    pg_loss = weighted_agg(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    metrics = {"pg_clipfrac": clipfrac.item(), "ppo_kl": ppo_kl.item(), "pg_clipfrac_lower": clipfrac_lower.item()}
    return pg_loss, metrics


@register("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (arXiv:2507.18071): PPO-clip on the sequence's length-normalised ratio s = (pi / pi_old)^(1 / L).

    L is the number of valid tokens. Every token of a sequence gets the value s (the token-mean log-ratio,
    exponentiated; log s clamped at 10) but the gradient of its own log-prob: log s_t = sg(log s) + log pi_t -
    sg(log pi_t). The clipped surrogate max(-A s_t, -A clip(s_t, 1 - low, 1 + high)) is always aggregated per
    sequence (``seq-mean-token-mean``), whatever ``loss_agg_mode`` says, as in verl.

    Returns:
        ``(pg_loss, {"pg_clipfrac", "ppo_kl", "pg_clipfrac_lower" (always 0)})``.
    """
    low, high = clip_bounds(config, "gspo")
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = (log_ratio * response_mask).sum(dim=-1) / response_mask.sum(dim=-1).clamp(min=1)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = token_log_ratio.clamp(max=10.0).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - low, 1 + high)
    per_token = torch.maximum(unclipped, clipped)
    pg_loss = weighted_agg(per_token, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    metrics = {
        "pg_clipfrac": masked_mean(torch.gt(clipped, unclipped).float(), response_mask).item(),
        "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        "pg_clipfrac_lower": 0.0,
    }
    return pg_loss, metrics


@register("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO (arXiv:2507.20673): the clipped objective on the geometric mean of a sequence's token ratios.

    Each token's log-ratio is clipped to [-low, high] on the pessimistic side for the sign of its advantage:
    l_t = sgn(A) * min(sgn(A) * log r_t, sgn(A) * clip(log r_t)). The sequence loss is -mean_t(A) * exp(mean_t l_t)
    (sequence-level advantages), and the loss is the plain mean over the batch's sequences; ``loss_agg_mode`` is not
    used. Importance weights enter per sequence as the geometric mean of the token weights.

    Returns:
        ``(pg_loss, {"pg_clipfrac" (clipped with A > 0), "ppo_kl", "pg_clipfrac_lower" (clipped with A < 0)})``.
    """
    low, high = clip_bounds(config, "geo_mean")
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    clamped = log_ratio.clamp(-low, high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    num_tokens = response_mask.sum(dim=-1) + 1e-8
    seq_ratio = torch.exp((pessimistic * response_mask).sum(dim=-1) / num_tokens)
    seq_advantage = (advantages * response_mask).sum(dim=-1) / num_tokens
    seq_losses = -seq_advantage * seq_ratio
    if rollout_is_weights is not None:
        seq_weights = torch.exp((torch.log(rollout_is_weights + 1e-10) * response_mask).sum(dim=-1) / num_tokens)
        seq_losses = seq_losses * seq_weights
    was_clipped = torch.ne(log_ratio, clamped)
    metrics = {
        "pg_clipfrac": masked_mean((was_clipped & (advantages > 0)).float(), response_mask).item(),
        "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        "pg_clipfrac_lower": masked_mean((was_clipped & (advantages < 0)).float(), response_mask).item(),
    }
    return seq_losses.mean(), metrics


@register("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, arXiv:2506.13585): clip the importance weight, not the update.

    Per token: -sg(clip(r, 1 - low, 1 + high)) * A * log pi. Unlike PPO-clip no token loses its gradient; a
    clipped ratio only bounds how much the token weighs.

    Returns:
        ``(pg_loss, {"pg_clipfrac" (share of ratios outside the band), "ppo_kl", "pg_clipfrac_lower" (0)})``.
    """
    low, high = clip_bounds(config, "cispo")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    clipped_ratio = ratio.clamp(1 - low, 1 + high).detach()
    per_token = -clipped_ratio * advantages * log_prob
    pg_loss = weighted_agg(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    metrics = {
        "pg_clipfrac": masked_mean(torch.ne(ratio, clipped_ratio).float(), response_mask).item(),
        "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        "pg_clipfrac_lower": 0.0,
    }
    return pg_loss, metrics


@register("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO (arXiv:2511.20347): a smooth sigmoid gate on the ratio in place of the hard clip.

    Per token: -f(r, tau) * A with f(r, tau) = sigmoid(tau * (r - 1)) * 4 / tau, whose slope at r = 1 is 1 (the
    plain policy gradient) and which flattens as r leaves 1. tau is ``config.tau_pos`` where A > 0 and
    ``config.tau_neg`` elsewhere. Aggregated per sequence (``seq-mean-token-mean``) whatever ``loss_agg_mode``
    says, as in verl.

    Returns:
        ``(pg_loss, {"pg_clipfrac" (0), "ppo_kl", "pg_clipfrac_lower" (0)})``.
    """
    tau_pos = torch.as_tensor(actor_option(config, "tau_pos"), dtype=advantages.dtype, device=advantages.device)
    tau_neg = torch.as_tensor(actor_option(config, "tau_neg"), dtype=advantages.dtype, device=advantages.device)
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    tau = torch.where(advantages > 0, tau_pos, tau_neg)
    gate = torch.sigmoid(tau * (log_ratio.exp() - 1.0)) * (4.0 / tau)
    pg_loss = weighted_agg(-gate * advantages, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    metrics = {"pg_clipfrac": 0.0, "ppo_kl": masked_mean(-log_ratio, response_mask).item(), "pg_clipfrac_lower": 0.0}
    return pg_loss, metrics
