"""Group-relative outcome advantage estimators: GRPO and its variants, RLOO, OPO, GPG, REINFORCE++-baseline.

Each response's score is the sum of its token rewards; the responses sampled for one prompt form a group (rows
sharing an ``index`` label, the prompt's uid), and each estimator compares a score with a baseline computed from its
group. The resulting scalar is broadcast over the response's valid tokens. Registered under verl's names; see
:mod:`verl.algorithms.advantages` for the calling convention. Shapes: B sequences, R response tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algorithms.advantages import group_ids, group_rows, register, resolve_norm_by_std
from verl.algorithms.algo_registry import AdvantageEstimator, algorithm_option
from verl.utils.torch_functional import masked_whiten


def _broadcast(per_sequence: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    advantages = per_sequence.unsqueeze(-1) * response_mask
    return advantages, advantages


def _group_means(scores: torch.Tensor, index: Any) -> torch.Tensor:
    """(B,) mean score of each row's group; 0 for a group of one (no baseline from a single sample)."""
    means = torch.zeros_like(scores)
    for rows in group_rows(index).values():
        if len(rows) > 1:
            means[rows] = scores[rows].mean()
    return means


@register(AdvantageEstimator.GRPO.value)
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative outcome advantage: (score - group mean) [/ (group std + epsilon)], broadcast over tokens.

    The std is the unbiased (Bessel-corrected) one. A group of one gets mean 0 and std 1, so its advantage is its
    score.

    Args:
        token_level_rewards, response_mask: (B, R).
        index: (B,) group labels.
        epsilon: added to the std before dividing.
        norm_adv_by_std_in_grpo: divide by the std (GRPO) or not (Dr. GRPO); when None, read from
            ``config.norm_adv_by_std_in_grpo``, else True.
        config: the algorithm config.

    Returns:
        ``(advantages, advantages)``, (B, R), 0 on padding.
    """
    norm_by_std = resolve_norm_by_std(norm_adv_by_std_in_grpo, config)
    scores = token_level_rewards.sum(dim=-1)
    normalised = torch.zeros_like(scores)
    for rows in group_rows(index).values():
        group = scores[rows]
        if len(rows) == 1:
            mean, std = torch.zeros((), dtype=scores.dtype), torch.ones((), dtype=scores.dtype)
        else:
            mean, std = group.mean(), group.std()
        centred = group - mean
        normalised[rows] = centred / (std + epsilon) if norm_by_std else centred
    return _broadcast(normalised, response_mask)


@register(AdvantageEstimator.GRPO_VECTORIZED.value)
@torch.no_grad()
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`compute_grpo_outcome_advantage` with the group statistics computed by scatter-adds.

    Same arguments and results (up to float rounding): unbiased group std, groups of one get mean 0 and std 1.
    Only mapping the labels to group ids is a Python loop; the statistics cost O(B) tensor operations instead
    of one small reduction per group.

    Returns:
        ``(advantages, advantages)``, (B, R), 0 on padding.
    """
    norm_by_std = resolve_norm_by_std(norm_adv_by_std_in_grpo, config)
    scores = token_level_rewards.sum(dim=-1)
    gid, num_groups = group_ids(index, scores.device)
    # statistics in float64: two-pass (mean, then squared deviations) so low-precision scores stay accurate
    scores64 = scores.double()
    counts = torch.zeros(num_groups, dtype=torch.float64, device=scores.device).index_add_(
        0, gid, torch.ones_like(scores64)
    )
    mean = torch.zeros_like(counts).index_add_(0, gid, scores64) / counts
    squared = (scores64 - mean[gid]).square()
    var = torch.zeros_like(counts).index_add_(0, gid, squared) / (counts - 1).clamp(min=1)
    single = counts == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(var), var.sqrt())
    centred = scores64 - mean[gid]
    normalised = centred / (std[gid] + epsilon) if norm_by_std else centred
    return _broadcast(normalised.to(scores.dtype), response_mask)


@register(AdvantageEstimator.RLOO.value)
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Leave-one-out baseline (RLOO): score_i - mean of the other scores in its group, broadcast over tokens.

    Equals ``(s_i - group mean) * n / (n - 1)``; a group of one keeps its score. ``epsilon`` and ``config`` are
    accepted for signature compatibility and unused.

    Returns:
        ``(advantages, advantages)``, (B, R), 0 on padding.
    """
    scores = token_level_rewards.sum(dim=-1)
    out = scores.clone()
    for rows in group_rows(index).values():
        n = len(rows)
        if n > 1:
            group = scores[rows]
            out[rows] = group * n / (n - 1) - group.mean() * n / (n - 1)
    return _broadcast(out, response_mask)


@register(AdvantageEstimator.RLOO_VECTORIZED.value)
@torch.no_grad()
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`compute_rloo_outcome_advantage` with scatter-adds: (n * s_i - group sum) / (n - 1).

    Equal to the loop form for groups of two or more. A group of one gets advantage 0 here (verl's
    ``rloo_vectorized``: there is no other sample to form a baseline from), where ``rloo`` keeps its score.

    Returns:
        ``(advantages, advantages)``, (B, R), 0 on padding.
    """
    scores = token_level_rewards.sum(dim=-1)
    gid, num_groups = group_ids(index, scores.device)
    scores64 = scores.double()
    counts = torch.zeros(num_groups, dtype=torch.float64, device=scores.device).index_add_(
        0, gid, torch.ones_like(scores64)
    )[gid]
    sums = torch.zeros(num_groups, dtype=torch.float64, device=scores.device).index_add_(0, gid, scores64)[gid]
    advantage = (counts * scores64 - sums) / (counts - 1).clamp(min=1) * (counts > 1)
    return _broadcast(advantage.to(scores.dtype), response_mask)


@register(AdvantageEstimator.GRPO_PASSK.value)
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k advantage (Chen et al., 2025, arXiv:2503.19595): only each group's best response learns.

    The best response of a group gets ``best - second best`` [/ (group std + epsilon)], every other response 0: a
    group is worth its best sample, and the best sample's marginal contribution is its lead over the runner-up.
    With ties for the best the lead is 0.

    Args:
        token_level_rewards, response_mask: (B, R).
        index: (B,) group labels; every group needs at least two responses.
        epsilon: added to the std before dividing.
        norm_adv_by_std_in_grpo: divide by the unbiased group std; when None, read from
            ``config.norm_adv_by_std_in_grpo``, else True.
        config: the algorithm config.

    Returns:
        ``(advantages, advantages)``, (B, R), 0 on padding.

    Raises:
        ValueError: for a group of one response.
    """
    norm_by_std = resolve_norm_by_std(norm_adv_by_std_in_grpo, config)
    scores = token_level_rewards.sum(dim=-1)
    out = torch.zeros_like(scores)
    for uid, rows in group_rows(index).items():
        if len(rows) < 2:
            raise ValueError(
                f"grpo_passk needs at least 2 responses per prompt, group {uid!r} has {len(rows)}; set "
                f"actor_rollout_ref.rollout.n >= 2."
            )
        group = scores[rows]
        top, top_pos = torch.topk(group, 2)
        lead = top[0] - top[1]
        out[rows[int(top_pos[0])]] = lead / (group.std() + epsilon) if norm_by_std else lead
    return _broadcast(out, response_mask)


@register(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE.value)
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: torch.Tensor,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline (Hu, 2025, arXiv:2501.03262): score - group mean, then whitened.

    The centred score is broadcast over the valid tokens and whitened over all valid tokens of the batch (so a
    longer response weighs more in the batch statistics). A group of one is centred on 0.

    Returns:
        ``(advantages, advantages)``, (B, R), 0 on padding.
    """
    scores = token_level_rewards.sum(dim=-1)
    centred, _ = _broadcast(scores - _group_means(scores, index), response_mask)
    advantages = masked_whiten(centred, response_mask) * response_mask
    return advantages, advantages


@register(AdvantageEstimator.OPO.value)
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (arXiv:2505.23585): score minus the length-weighted mean score of its group.

    The baseline sum_j(L_j * s_j) / sum_j(L_j), with L_j the number of valid tokens, is the variance-optimal
    constant baseline when the gradient's size grows with the response length. A group of one gets baseline 0.

    Returns:
        ``(advantages, advantages)``, (B, R), 0 on padding.
    """
    scores = token_level_rewards.sum(dim=-1)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)
    baselines = torch.zeros_like(scores)
    for rows in group_rows(index).values():
        if len(rows) > 1:
            weights = lengths[rows]
            baselines[rows] = (weights * scores[rows]).sum() / weights.sum().clamp(min=1)
    return _broadcast(scores - baselines, response_mask)


@register(AdvantageEstimator.GPG.value)
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (arXiv:2504.02546): alpha * (score - group mean) / f_norm, alpha = B / (rows with a non-zero score).

    The factor alpha undoes the dilution of the batch-mean loss by responses whose score is 0 (which carry no
    signal under a 0/1 reward); it is recomputed from the batch, so the ``alpha`` argument is accepted for verl's
    signature and ignored, as in verl. A group of one is centred on 0.

    Returns:
        ``(advantages, advantages)``, (B, R), 0 on padding.
    """
    scores = token_level_rewards.sum(dim=-1)
    alpha = scores.shape[0] / max(int(torch.count_nonzero(scores)), 1)
    return _broadcast(alpha * (scores - _group_means(scores, index)) / f_norm, response_mask)


def _gdpo_components(
    token_level_rewards: torch.Tensor, config: Any, non_tensor_batch: Any, batch: Any
) -> tuple[list[torch.Tensor], list[float]]:
    """The (B,) reward components GDPO normalises one by one, and their weights.

    With verl's trainer inputs (the algorithm config, the batch and its non-tensor part) the components are the
    non-tensor keys named by ``algorithm.gdpo_reward_keys`` (what the reward function returned besides the score);
    otherwise the one component is the summed token reward, and GDPO reduces to GRPO followed by whitening.
    """
    if config is None or non_tensor_batch is None or batch is None:
        return [token_level_rewards.sum(dim=-1)], [1.0]
    keys = algorithm_option(config, "gdpo_reward_keys")
    if not keys:
        raise ValueError(
            "adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the names of the reward components your reward "
            "function returns in its result dict (e.g. [format_reward, accuracy_reward])."
        )
    components = []
    for key in keys:
        if key not in non_tensor_batch:
            raise ValueError(
                f"gdpo reward component {key!r} (algorithm.gdpo_reward_keys) is not in the batch; the batch has "
                f"{sorted(non_tensor_batch)}. Return {key!r} in the reward function's result dict."
            )
        values = np.asarray(non_tensor_batch[key], dtype=np.float32)
        components.append(torch.as_tensor(values, device=token_level_rewards.device))
    weights = algorithm_option(config, "gdpo_reward_weights")
    weights = [1.0] * len(keys) if weights is None else [float(w) for w in weights]
    if len(weights) != len(keys):
        raise ValueError(
            f"algorithm.gdpo_reward_weights has {len(weights)} entries for {len(keys)} gdpo_reward_keys; give one "
            f"weight per key or leave it null (all 1)."
        )
    return components, weights


@register(AdvantageEstimator.GDPO.value)
@torch.no_grad()
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    non_tensor_batch: dict | None = None,
    batch: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (arXiv:2601.05242): GRPO-normalise each reward component on its own, add them weighted, whiten.

    Normalising the components separately keeps a reward with a large spread from drowning out the others, which
    summing them before GRPO would do. Step by step: A_k = GRPO(r_k) per group; A = sum_k w_k A_k, broadcast over
    the valid tokens; then whitened over all valid tokens of the batch.

    Args:
        token_level_rewards, response_mask: (B, R).
        index: (B,) group labels.
        epsilon, norm_adv_by_std_in_grpo: as for :func:`compute_grpo_outcome_advantage`.
        config: the algorithm config; ``gdpo_reward_keys`` (required with the batch) and ``gdpo_reward_weights``.
        non_tensor_batch: the batch's non-tensor fields holding one (B,) array per reward component.
        batch: the batch's tensors; given together with ``non_tensor_batch`` by verl's trainer (only its presence
            is used here).

    Returns:
        ``(advantages, advantages)``, (B, R), 0 on padding.

    Raises:
        ValueError: without ``gdpo_reward_keys``, for a key missing from the batch, or mismatched weights.
    """
    components, weights = _gdpo_components(token_level_rewards, config, non_tensor_batch, batch)
    total = torch.zeros_like(token_level_rewards[:, 0], dtype=torch.float32)
    ones = torch.ones_like(total).unsqueeze(-1)
    for weight, component in zip(weights, components, strict=True):
        normalised, _ = compute_grpo_outcome_advantage(
            component.float().unsqueeze(-1), ones, index, epsilon, norm_adv_by_std_in_grpo, config
        )
        total = total + weight * normalised[:, 0]
    combined = total.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask
    advantages = masked_whiten(combined, response_mask) * response_mask
    return advantages, advantages
