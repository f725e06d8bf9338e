"""Covariance-controlled policy losses against entropy collapse: Clip-Cov and KL-Cov (Cui et al., arXiv:2505.22617).

The policy's entropy falls fastest through tokens whose log-prob and advantage covary strongly (a confident token
that is also rewarded). Both losses find those tokens by the per-token product (A - mean A) * (log pi - mean log pi)
over the batch's valid tokens and restrain a small share of them: Clip-Cov drops their gradient, KL-Cov adds a
penalty on their log-ratio. Settings come from ``config.policy_loss`` (``clip_cov_ratio``, ``clip_cov_lb``,
``clip_cov_ub``, ``kl_cov_ratio``, ``ppo_kl_coef``); calling convention as in
:mod:`verl.algorithms.policy_losses`.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.algo_registry import clip_bounds, policy_loss_option
from verl.algorithms.policy_losses import clamped_log_ratio, register, weighted_agg
from verl.utils.torch_functional import masked_mean


def _positive_share(config: Any, key: str, loss_name: str) -> float:
    share = policy_loss_option(config, key)
    if not share > 0:
        raise ValueError(
            f"policy loss {loss_name!r} needs actor_rollout_ref.actor.policy_loss.{key} > 0 (the share of tokens "
            f"to restrain), got {share!r}."
        )
    return float(share)


@register("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov: PPO-clip, plus the gradient dropped on a few high-covariance tokens.

    Candidates are the valid tokens PPO's clip left unclipped whose covariance lies strictly between
    ``clip_cov_lb`` and ``clip_cov_ub``; max(1, int(``clip_cov_ratio`` x valid tokens)) of them, drawn at random
    when there are more, get loss 0. There is no dual clip.

    Returns:
        ``(pg_loss, {"pg_clipfrac" (share of tokens dropped by the covariance rule), "ppo_kl"})``.

    Raises:
        ValueError: when ``clip_cov_ratio`` is not positive, or without a config.
    """
    low, high = clip_bounds(config, "clip_cov")
    share = _positive_share(config, "clip_cov_ratio", "clip_cov")
    lower, upper = policy_loss_option(config, "clip_cov_lb"), policy_loss_option(config, "clip_cov_ub")
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - low, 1 + high)
    valid = response_mask > 0
    detached = log_prob.detach()
    cov = (advantages - masked_mean(advantages, response_mask)) * (detached - masked_mean(detached, response_mask))
    candidates = (cov > lower) & (cov < upper) & valid & ~torch.gt(clipped, unclipped)
    positions = candidates.nonzero()
    num_dropped = max(int(share * response_mask.sum().item()), 1)
    if positions.shape[0] > num_dropped:
        positions = positions[torch.randperm(positions.shape[0], device=positions.device)[:num_dropped]]
    keep = torch.ones_like(advantages)
    keep[positions[:, 0], positions[:, 1]] = 0.0
    per_token = torch.maximum(unclipped, clipped) * keep
    pg_loss = weighted_agg(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    metrics = {
        "pg_clipfrac": masked_mean((keep == 0).float(), response_mask).item(),
        "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
    }
    return pg_loss, metrics


@register("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov: the unclipped surrogate -A * r, plus ``ppo_kl_coef`` * abs(log r) on the top-covariance tokens.

    The max(1, int(``kl_cov_ratio`` x valid tokens)) valid tokens with the largest covariance (centred over the
    valid tokens) get the penalty; no token is clipped.

    Returns:
        ``(pg_loss, {"ppo_kl"})``, here the mean of abs(log r) over the valid tokens.

    Raises:
        ValueError: when ``kl_cov_ratio`` is not positive.
    """
    share = _positive_share(config, "kl_cov_ratio", "kl_cov")
    coef = float(policy_loss_option(config, "ppo_kl_coef"))
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    surrogate = -advantages * log_ratio.exp()
    penalised = surrogate + coef * log_ratio.abs()
    valid = (response_mask > 0).reshape(-1)
    chosen = torch.zeros_like(valid)
    num_valid = int(valid.sum().item())
    if num_valid > 0:
        adv = advantages.detach().reshape(-1)[valid]
        logp = log_prob.detach().reshape(-1)[valid]
        cov = (adv - adv.mean()) * (logp - logp.mean())
        top = torch.topk(cov, max(1, int(num_valid * share))).indices
        chosen[valid.nonzero(as_tuple=True)[0][top]] = True
    per_token = torch.where(chosen.reshape(advantages.shape), penalised, surrogate)
    pg_loss = weighted_agg(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {"ppo_kl": masked_mean(log_ratio.abs(), response_mask).item()}
