"""PPO-family maths: loss aggregation, KL estimators, policy and value losses, advantage estimators.

Policy losses and advantage estimators live in registries (``register_policy_loss`` / ``register_adv_est``) so
recipes can add their own. Every estimator accepts the keyword arguments the trainer has (token_level_rewards,
values, response_mask, index, gamma, lam, norm_adv_by_std_in_grpo, epsilon) and ignores the ones it does not use,
so one call site serves them all. Shapes: B sequences, R response tokens.
"""

from __future__ import annotations

from collections import defaultdict
from enum import Enum
from typing import Any

import numpy as np
import torch

from verl.utils.config import cfg_get as _get
from verl.utils.registry import Registry
from verl.utils.torch_functional import masked_mean, masked_whiten

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


# ---------------------------------------------------------------------------------------------- aggregation, KL


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Aggregate a (B, R) per-token loss into a scalar.

    token-mean: mean over all valid tokens; seq-mean-token-sum: mean over sequences of per-sequence sums;
    seq-mean-token-mean: mean over sequences of per-sequence means; seq-mean-token-sum-norm: per-sequence sums
    divided by R (the padded length), averaged over sequences.
    """
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    seq_sums = (loss_mat * loss_mask).sum(dim=-1)
    if loss_agg_mode == "seq-mean-token-sum":
        return seq_sums.mean()
    if loss_agg_mode == "seq-mean-token-mean":
        return (seq_sums / loss_mask.sum(dim=-1).clamp(min=1)).mean()
    if loss_agg_mode == "seq-mean-token-sum-norm":
        return seq_sums.sum() / (loss_mask.shape[-1] * loss_mask.shape[0])
    raise ValueError(f"loss_agg_mode={loss_agg_mode!r} is not supported; use one of {list(LOSS_AGG_MODES)}.")


KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference, from their log-probs (B, R)."""
    diff = logprob - ref_logprob
    if kl_penalty in ("kl", "k1"):
        return diff
    if kl_penalty == "abs":
        return diff.abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * diff.square()
    if kl_penalty in ("low_var_kl", "k3"):
        # k3 = r - log r - 1 with r = p_ref / p; non-negative, unbiased, low variance; clamped for stability
        log_ratio = -diff
        return (log_ratio.exp() - log_ratio - 1).clamp(min=-10, max=10)
    raise ValueError(f"kl_penalty={kl_penalty!r} is not supported; use one of {list(KL_TYPES)}.")


class FixedKLController:
    """A constant KL coefficient."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Moves the KL coefficient so that the observed KL tracks ``target_kl`` (Ziegler et al., 2019)."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value, self.target, self.horizon = init_kl_coef, target_kl, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + error * n_steps / self.horizon


def get_kl_controller(kl_ctrl_config: Any):
    kind = _get(kl_ctrl_config, "type", "fixed")
    if kind == "fixed":
        return FixedKLController(float(_get(kl_ctrl_config, "kl_coef", 0.001)))
    if kind == "adaptive":
        return AdaptiveKLController(
            float(_get(kl_ctrl_config, "kl_coef", 0.001)),
            float(_get(kl_ctrl_config, "target_kl", 0.1)),
            int(_get(kl_ctrl_config, "horizon", 10000)),
        )
    raise ValueError(f"algorithm.kl_ctrl.type={kind!r} is not supported; use fixed or adaptive.")


# ---------------------------------------------------------------------------------------------- policy losses

POLICY_LOSS_REGISTRY = Registry("policy loss", config_key="actor_rollout_ref.actor.policy_loss")


def register_policy_loss(name: str):
    """Decorator: register ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config)``."""
    return POLICY_LOSS_REGISTRY.register(name)


def get_policy_loss_fn(name: str):
    return POLICY_LOSS_REGISTRY.get(name)


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
):
    """PPO clipped surrogate with dual clip for negative advantages.

    Args:
        old_log_prob, log_prob, advantages, response_mask: (B, R).
        cliprange: symmetric clip range (default for both sides); cliprange_low / cliprange_high override a side.
        clip_ratio_c: dual-clip bound (> 1): for A < 0 the loss is capped at -A * clip_ratio_c.

    Returns:
        (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower) scalars.
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_c must be > 1.0, got {clip_ratio_c}.")
    low = cliprange if cliprange_low is None else cliprange_low
    high = cliprange if cliprange_high is None else cliprange_high
    if low is None or high is None:
        raise ValueError("compute_policy_loss needs cliprange or both cliprange_low and cliprange_high.")
    log_ratio = (log_prob - old_log_prob).clamp(min=-20.0, max=20.0)
    ratio = log_ratio.exp()
    ppo_kl = masked_mean(-log_ratio, response_mask)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - low, 1 + high)
    clip_loss = torch.maximum(unclipped, clipped)
    pg_clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), response_mask)
    dual_bound = -advantages * clip_ratio_c
    dual_loss = torch.minimum(dual_bound, clip_loss)
    pg_clipfrac_lower = masked_mean((torch.gt(clip_loss, dual_bound) & (advantages < 0)).float(), response_mask)
    per_token = torch.where(advantages < 0, dual_loss, clip_loss)
    pg_loss = agg_loss(per_token, response_mask, loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode: str = "token-mean", config: Any = None
):
    """The registered PPO-clip loss; clip settings come from the actor config. Returns (pg_loss, metrics)."""
    clip_ratio = _get(config, "clip_ratio", 0.2)
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        cliprange=clip_ratio,
        cliprange_low=_get(config, "clip_ratio_low", None),
        cliprange_high=_get(config, "clip_ratio_high", None),
        clip_ratio_c=float(_get(config, "clip_ratio_c", 3.0)),
        loss_agg_mode=loss_agg_mode,
    )
    metrics = {"pg_clipfrac": clipfrac.item(), "ppo_kl": ppo_kl.item(), "pg_clipfrac_lower": clipfrac_lower.item()}
    return pg_loss, metrics


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
):
    """Clipped value loss 0.5 * max((v - G)^2, (clip(v, v_old +- c) - G)^2). Returns (vf_loss, vf_clipfrac)."""
    clipped = values + (vpreds - values).clamp(-cliprange_value, cliprange_value)
    loss_unclipped = (vpreds - returns).square()
    loss_clipped = (clipped - returns).square()
    vf_loss = 0.5 * agg_loss(torch.maximum(loss_unclipped, loss_clipped), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac


# ---------------------------------------------------------------------------------------------- advantages


class AdvantageEstimator(str, Enum):
    GAE = "gae"
    GRPO = "grpo"
    RLOO = "rloo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"


ADV_ESTIMATOR_REGISTRY = Registry("advantage estimator", config_key="algorithm.adv_estimator")


def register_adv_est(name: str | AdvantageEstimator):
    """Decorator: register an advantage estimator returning (advantages (B, R), returns (B, R))."""
    return ADV_ESTIMATOR_REGISTRY.register(name.value if isinstance(name, AdvantageEstimator) else name)


def get_adv_estimator_fn(name: str | AdvantageEstimator):
    return ADV_ESTIMATOR_REGISTRY.get(name.value if isinstance(name, AdvantageEstimator) else name)


@register_adv_est(AdvantageEstimator.GAE)
@torch.no_grad()
def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam, **kwargs):
    """Generalised advantage estimation; padded positions neither receive nor pass on credit.

    Returns:
        (whitened advantages, returns = advantages + values), both (B, R).
    """
    gamma, lam = float(gamma), float(lam)
    next_value = torch.zeros_like(values[:, 0])
    running = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[-1])):
        valid = response_mask[:, t].to(values.dtype)
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        new_running = delta + gamma * lam * running
        # a pad position keeps the carry of the next valid token untouched
        running = valid * new_running + (1 - valid) * running
        next_value = valid * values[:, t] + (1 - valid) * next_value
        advantages[:, t] = running * valid
    returns = advantages + values
    return masked_whiten(advantages, response_mask) * response_mask, returns


def _group_scores(scores: torch.Tensor, index) -> dict[Any, list[int]]:
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, uid in enumerate(np.asarray(index, dtype=object).tolist()):
        groups[uid].append(i)
    return groups


@register_adv_est(AdvantageEstimator.GRPO)
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards, response_mask, index, epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True, **kwargs
):
    """Group-relative outcome advantage: (score - group mean) [/ (group std + eps)], broadcast over tokens.

    A group of one gets mean 0 and std 1 (its advantage is its score). Returns (advantages, advantages).
    """
    scores = token_level_rewards.sum(dim=-1)
    normalised = torch.zeros_like(scores)
    for rows in _group_scores(scores, index).values():
        group = scores[rows]
        if len(rows) == 1:
            mean, std = torch.zeros(()), torch.ones(())
        else:
            mean, std = group.mean(), group.std()
        centred = group - mean
        normalised[rows] = centred / (std + epsilon) if norm_adv_by_std_in_grpo else centred
    advantages = normalised.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO)
@torch.no_grad()
def compute_rloo_outcome_advantage(token_level_rewards, response_mask, index, epsilon: float = 1e-6, **kwargs):
    """Leave-one-out baseline: score_i - mean of the other scores in its group (= (s_i - mean) * n / (n - 1))."""
    scores = token_level_rewards.sum(dim=-1)
    out = scores.clone()
    for rows in _group_scores(scores, index).values():
        n = len(rows)
        if n > 1:
            group = scores[rows]
            out[rows] = group * n / (n - 1) - group.mean() * n / (n - 1)
    advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, gamma, **kwargs):
    """Discounted reward-to-go per token, whitened over the batch. Returns (advantages, returns)."""
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[-1])):
        running = token_level_rewards[:, t] + float(gamma) * running
        returns[:, t] = running
        running = running * response_mask[:, t]  # no credit flows back across padding
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns
