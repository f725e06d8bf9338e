"""Advantage estimators that work on each response's own returns: GAE, REINFORCE++ and ReMax, plus shared helpers.

Every estimator is registered under verl's name in ``ADV_ESTIMATOR_REGISTRY`` and called with keyword arguments
(``token_level_rewards``, ``response_mask``, ``config`` = the ``algorithm`` section, and where available ``index``,
``values``, ``reward_baselines``, ...); it returns ``(advantages, returns)``, both (B, R). Built-ins accept (and
ignore) keyword arguments they do not use, so one trainer call serves them all. The group-relative estimators are
in :mod:`verl.algorithms.group_advantages`, the per-token baselines in :mod:`verl.algorithms.token_baselines`.
Shapes: B sequences, R response tokens.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch

from verl.algorithms.algo_registry import ADV_ESTIMATOR_REGISTRY, AdvantageEstimator
from verl.utils.torch_functional import masked_whiten

register = ADV_ESTIMATOR_REGISTRY.register


def from_config(value: Any, config: Any, attribute: str, estimator: str) -> Any:
    """An explicitly passed value, else ``config.<attribute>``; the message names the config key when neither."""
    if value is not None:
        return value
    if config is None:
        raise ValueError(
            f"{estimator} needs {attribute}: pass {attribute}=... or config=<algorithm config> (algorithm.{attribute})."
        )
    return getattr(config, attribute)


def resolve_norm_by_std(norm_adv_by_std_in_grpo: bool | None, config: Any) -> bool:
    """The explicit flag, else ``config.norm_adv_by_std_in_grpo``, else True (the original GRPO)."""
    if norm_adv_by_std_in_grpo is not None:
        return bool(norm_adv_by_std_in_grpo)
    if config is not None:
        return bool(config.norm_adv_by_std_in_grpo)
    return True


def group_rows(index: Any) -> dict[Any, list[int]]:
    """Row ids per group label, in first-seen order."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, uid in enumerate(np.asarray(index, dtype=object).tolist()):
        groups[uid].append(i)
    return groups


def group_ids(index: Any, device: torch.device) -> tuple[torch.Tensor, int]:
    """(B,) dense group id per row (0 .. G-1 in first-seen order) and the number of groups G."""
    groups = group_rows(index)
    ids = torch.empty(sum(len(rows) for rows in groups.values()), dtype=torch.long)
    for gid, rows in enumerate(groups.values()):
        ids[rows] = gid
    return ids.to(device), len(groups)


def reward_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, R) undiscounted sum of the valid rewards from each position to the end."""
    return (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])


@register(AdvantageEstimator.GAE.value)
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | None = None,
    lam: float | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation; padded positions neither receive nor pass on credit.

    Args:
        token_level_rewards, values, response_mask: (B, R).
        gamma, lam: discount and GAE lambda; when None, read from ``config.gamma`` / ``config.lam``.
        config: the algorithm config.

    Returns:
        ``(advantages, returns)``, (B, R): advantages whitened over the valid tokens (0 on padding),
        returns = raw advantages + values.
    """
    gamma = float(from_config(gamma, config, "gamma", "compute_gae_advantage_return"))
    lam = float(from_config(lam, config, "lam", "compute_gae_advantage_return"))
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


@register(AdvantageEstimator.REINFORCE_PLUS_PLUS.value)
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    gamma: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted reward-to-go per token, whitened over the batch's valid tokens.

    Masked positions inside a response (a tool's or user's tokens in a multi-turn response) are skipped: the
    return of the next valid token passes through them undiscounted, as in GAE, so a final reward still reaches the
    earlier turns. They get return 0 and advantage 0.

    Args:
        token_level_rewards, response_mask: (B, R).
        config: the algorithm config; ``config.gamma`` is the discount unless ``gamma`` is passed.
        gamma: explicit discount (overrides the config).

    Returns:
        ``(advantages, returns)``, (B, R); both 0 on masked positions.
    """
    gamma = float(from_config(gamma, config, "gamma", "compute_reinforce_plus_plus_outcome_advantage"))
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[-1])):
        valid = response_mask[:, t].to(token_level_rewards.dtype)
        candidate = token_level_rewards[:, t] + gamma * running
        returns[:, t] = candidate * valid
        running = valid * candidate + (1 - valid) * running
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@register(AdvantageEstimator.REMAX.value)
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: reward-to-go minus the reward of a greedy baseline response.

    Args:
        token_level_rewards, response_mask: (B, R).
        reward_baselines: (B,) score of each prompt's greedy response.
        config: the algorithm config (unused).

    Returns:
        ``(advantages, returns)``, (B, R): returns are the undiscounted reward-to-go over valid tokens, and
        advantages = returns - baseline on valid tokens, 0 on padding. With an outcome reward (one score on the
        last valid token) every valid token's advantage is ``score - baseline``.
    """
    if reward_baselines is None:
        raise ValueError(
            "compute_remax_outcome_advantage needs reward_baselines (B,): the scores of greedy responses, stored "
            "in the batch as 'reward_baselines'."
        )
    returns = reward_to_go(token_level_rewards, response_mask)
    advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns
