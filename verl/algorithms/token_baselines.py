"""Optimal token baselines: a baseline per prompt group and per response position instead of one per response.

The variance-minimising baseline at position t is B_t = E[G_t W_t] / E[W_t]: the reward-to-go G_t averaged over the
group, weighted by W_t, the sum over positions j <= t of the squared norm of grad log pi(y_j). For a softmax policy
that squared norm is 1 - 2 pi(y_j) + sum_v pi(v)^2 (with respect to the logits), so W_t needs the sampled token's
probability (``old_log_probs``) and the sum of squared probabilities over the vocabulary (``sum_pi_squared``), both
(B, R) from the actor. ``optimal_token_baseline`` aligns responses by absolute position;
``tir_optimal_token_baseline`` (tool-integrated, multi-turn) aligns them by the count of the policy's own tokens,
skipping the masked tool or user tokens in between. Registered under verl's names.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algorithms.advantages import group_rows, register, reward_to_go
from verl.algorithms.algo_registry import AdvantageEstimator


def _cumulative_path_variance(
    old_log_probs: torch.Tensor | None,
    sum_pi_squared: torch.Tensor | None,
    response_mask: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
    estimator: str,
) -> torch.Tensor:
    """(B, R) W_t: the running sum over valid positions of 1 - 2 pi_t + sum pi^2 (times the IS weight squared)."""
    if old_log_probs is None or sum_pi_squared is None:
        raise ValueError(
            f"adv_estimator={estimator} needs old_log_probs and sum_pi_squared (B, R) from the actor (in verl: "
            f"actor_rollout_ref.actor.calculate_sum_pi_squared=true); pass both, or use grpo or rloo."
        )
    per_token = 1 - 2 * old_log_probs.exp() + sum_pi_squared
    if rollout_is_weights is not None:
        # under truncated importance sampling the gradient's variance scales with the squared weight
        per_token = per_token * rollout_is_weights.square()
    return (per_token * response_mask).cumsum(dim=-1)


def _zero_longest_tail(baselines: torch.Tensor, rows: list[int], lengths: torch.Tensor) -> None:
    """Past the second-longest response only the longest one remains, and its own return would be its baseline
    (advantage 0); give those positions baseline 0 instead, so the longest response's tail still learns."""
    ordered = torch.sort(lengths).values
    longest, runner_up = int(ordered[-1]), int(ordered[-2])
    holders = (lengths == longest).nonzero(as_tuple=True)[0]
    if holders.numel() == 1 and longest > runner_up:
        baselines[rows[int(holders[0])], runner_up:] = 0.0


def _group_baselines(
    returns: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
    groups: list[list[int]],
    handle_zero_tail: bool,
    eps: float,
) -> torch.Tensor:
    """(B, L) per-position baselines sum_i(G_i,t W_i,t) / sum_i(W_i,t) over each group; 0 for a group of one."""
    baselines = torch.zeros_like(returns)
    for rows in groups:
        if len(rows) < 2:
            continue
        idx = torch.tensor(rows, device=returns.device)
        group_w = weights[idx] * mask[idx]
        numerator = (returns[idx] * group_w).sum(dim=0)
        baselines[idx] = (numerator / (group_w.sum(dim=0) + eps)).to(baselines.dtype)
        if handle_zero_tail:
            _zero_longest_tail(baselines, rows, mask[idx].sum(dim=-1))
    return baselines


@register(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE.value)
@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantage G_t - B_t with the optimal per-position baseline of each prompt group (see the module docstring).

    Args:
        token_level_rewards, response_mask: (B, R).
        index: (B,) group labels.
        old_log_probs: (B, R) log-probability of each sampled token under the policy that sampled it.
        sum_pi_squared: (B, R) sum over the vocabulary of the squared probabilities at each position.
        rollout_is_weights: optional (B, R) truncated importance weights; W_t then sums w_j^2 times the squared
            score norm.
        handle_zero_tail: give baseline 0 to the positions of a group's unique longest response past the
            second-longest one.
        epsilon: added to the denominator.

    Returns:
        ``(advantages, returns)``, (B, R): returns the reward-to-go, advantages 0 on padding. A group of one has
        baseline 0 (advantage = return).

    Raises:
        ValueError: without ``old_log_probs`` or ``sum_pi_squared``.
    """
    weights = _cumulative_path_variance(
        old_log_probs, sum_pi_squared, response_mask, rollout_is_weights, "optimal_token_baseline"
    )
    returns = reward_to_go(token_level_rewards, response_mask)
    groups = list(group_rows(index).values())
    baselines = _group_baselines(returns, weights, response_mask, groups, handle_zero_tail, epsilon)
    return (returns - baselines) * response_mask, returns


def _compact(values: torch.Tensor, valid: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, L) each row's valid entries moved to the front, zero-padded; L the longest row's valid count."""
    out = values.new_zeros(values.shape[0], int(lengths.max()) if lengths.numel() else 0)
    for i in range(values.shape[0]):
        out[i, : int(lengths[i])] = values[i, valid[i]]
    return out


@register(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE.value)
@torch.no_grad()
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`compute_optimal_token_baseline_advantage` with positions counted in the policy's own tokens.

    In a multi-turn response the masked tool or user tokens shift the policy's tokens by different amounts in
    different responses; here the k-th valid token of every response of a group shares one baseline. Responses
    without a valid token are left out of their group. Same arguments and results.
    """
    weights = _cumulative_path_variance(
        old_log_probs, sum_pi_squared, response_mask, rollout_is_weights, "tir_optimal_token_baseline"
    )
    returns = reward_to_go(token_level_rewards, response_mask)
    valid = response_mask.bool()
    lengths = response_mask.sum(dim=-1).long()
    compact_returns = _compact(returns, valid, lengths)
    compact_weights = _compact(weights, valid, lengths)
    compact_mask = (torch.arange(compact_returns.shape[-1], device=lengths.device) < lengths[:, None]).to(returns.dtype)
    present = (lengths > 0).tolist()
    groups = [[i for i in rows if present[i]] for rows in group_rows(index).values()]
    baselines = _group_baselines(compact_returns, compact_weights, compact_mask, groups, handle_zero_tail, epsilon)
    compact_advantages = compact_returns - baselines
    advantages = torch.zeros_like(returns)
    for i in range(returns.shape[0]):
        advantages[i, valid[i]] = compact_advantages[i, : int(lengths[i])]
    return advantages * response_mask, returns
