"""The training-inference mismatch: how far the rollout engine's probabilities are from the trainer's, and the fix.

The rollout engine samples each response token from its own distribution mu and reports log mu of it
(``rollout_log_probs``); the trainer computes pi_old of the same tokens (``old_log_probs``). Both should be the same
policy, but they compute differently (precision, kernels, batch shapes), and bf16's short mantissa makes them
disagree far more than fp16's (Qi et al., 2025). :func:`compute_mismatch_metrics` measures the gap every step, with
verl's metric names. :func:`compute_rollout_correction` corrects for it, as ``algorithm.rollout_correction`` asks:
truncated importance weights min(pi_old / mu, C), per token or per sequence, that multiply the policy loss, and
rejection of the tokens or sequences whose ratio leaves [1/C', C'].

All functions take (B, R) float tensors and a (B, R) 0/1 ``response_mask``; positions outside the mask never count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from verl.utils.torch_functional import masked_mean

if TYPE_CHECKING:
    from verl.workers.config.ppo import RolloutCorrectionConfig

# log-ratios are clamped to exp(+-20) before exponentiating: a sequence's summed log-ratio can be large
LOG_RATIO_BOUND = 20.0


def _sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) sum of the masked token log-ratios of each sequence: log of the product of the token ratios."""
    return (log_ratio * mask).sum(dim=-1)


def compute_mismatch_metrics(
    rollout_log_probs: torch.Tensor, trainer_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """verl's mismatch metrics between the engine (mu) and the trainer (pi), over the response tokens.

    With p = exp(log p) per token and r = pi / mu:

    - ``training/rollout_probs_diff_mean``, ``_max``, ``_std``: of |p_mu - p_pi| over the tokens;
    - ``training/rollout_actor_probs_pearson_corr``: Pearson correlation of p_mu and p_pi over the tokens;
    - ``rollout_corr/kl``: the k1 estimate of KL(mu || pi) on mu's samples, mean of log mu - log pi;
    - ``rollout_corr/k3_kl``: the k3 estimate, mean of (r - 1) - log r;
    - ``rollout_corr/log_ppl_diff``: mean over sequences of log ppl(mu) - log ppl(pi), where
      log ppl = -(token mean of the log-probs); ``log_ppl_abs_diff`` its absolute value, averaged;
    - ``rollout_corr/chi2_token``: E[r^2] - 1 over tokens; ``chi2_seq``: E[(prod_t r_t)^2] - 1 over sequences.

    Args:
        rollout_log_probs: (B, R) log mu of the sampled tokens.
        trainer_log_probs: (B, R) log pi of the same tokens.
        response_mask: (B, R) 0/1.

    Returns:
        The metrics as floats (all 0 when the mask is empty).
    """
    mask = response_mask.float()
    if mask.sum() == 0:
        return {}
    mu, pi = rollout_log_probs.float(), trainer_log_probs.float()
    valid = mask.bool()
    p_mu, p_pi = mu.exp()[valid], pi.exp()[valid]
    diff = (p_mu - p_pi).abs()
    log_ratio = (pi - mu).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # log r
    ratio = log_ratio.exp()
    has_tokens = mask.sum(dim=-1) > 0
    # log ppl(mu) - log ppl(pi) = mean_t(log pi) - mean_t(log mu) = token mean of log r, per sequence
    ppl_diff = masked_mean(log_ratio, mask, axis=-1)[has_tokens]
    seq_log_ratio = _sequence_log_ratio(log_ratio, mask).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)[has_tokens]
    metrics = {
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_probs_diff_std": diff.std(unbiased=False).item(),
        "training/rollout_actor_probs_pearson_corr": _pearson(p_mu, p_pi),
        "rollout_corr/kl": masked_mean(-log_ratio, mask).item(),
        "rollout_corr/k3_kl": masked_mean(ratio - 1 - log_ratio, mask).item(),
        "rollout_corr/log_ppl_diff": ppl_diff.mean().item(),
        "rollout_corr/log_ppl_abs_diff": ppl_diff.abs().mean().item(),
        "rollout_corr/chi2_token": masked_mean(ratio.square(), mask).item() - 1.0,
        "rollout_corr/chi2_seq": (2 * seq_log_ratio).exp().mean().item() - 1.0,
    }
    return metrics


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two 1-D samples; 1.0 when either is constant and they are equal, else 0.0."""
    xc, yc = x - x.mean(), y - y.mean()
    denominator = (xc.square().sum() * yc.square().sum()).sqrt()
    if denominator == 0:
        return 1.0 if torch.equal(x, y) else 0.0
    return ((xc * yc).sum() / denominator).item()


def compute_rollout_correction(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    config: RolloutCorrectionConfig,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """Importance weights and rejection for the gap between the engine (mu) and the trainer's old policy.

    With the ratio r = pi_old / mu per token (``rollout_is=token``) or its product over each sequence
    (``sequence``, the same weight on every token of the sequence):

    - weights w = min(r, ``rollout_is_threshold``), 0 outside the mask; with ``rollout_is_batch_normalize`` divided
      by their mean over the valid tokens (token level) or over the sequences (sequence level);
    - rejection (``rollout_rs``): a token (or every token of a sequence) whose ratio lies outside
      [1 / C, C], C = ``rollout_rs_threshold`` (or ``rollout_is_threshold`` when null), leaves the mask.

    Args:
        old_log_probs: (B, R) log pi_old.
        rollout_log_probs: (B, R) log mu.
        response_mask: (B, R) 0/1.
        config: ``algorithm.rollout_correction``.

    Returns:
        (weights (B, R) or None without ``rollout_is``, the response mask after rejection (B, R), metrics:
        ``rollout_corr/is_weight_mean`` / ``_max`` / ``is_clip_frac`` (share of weights truncated) and
        ``rollout_corr/rs_reject_frac`` (share of valid tokens rejected)).
    """
    mask = response_mask.float()
    log_ratio = (old_log_probs.float() - rollout_log_probs.float()).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    metrics: dict[str, float] = {}
    weights = None
    if config.rollout_is is not None:
        ratio = _ratio_at_level(log_ratio, mask, config.rollout_is)
        weights = ratio.clamp(max=config.rollout_is_threshold) * mask
        metrics["rollout_corr/is_clip_frac"] = masked_mean((ratio > config.rollout_is_threshold).float(), mask).item()
        if config.rollout_is_batch_normalize:
            weights = weights / _batch_mean(weights, mask, config.rollout_is).clamp(min=1e-8)
        metrics["rollout_corr/is_weight_mean"] = masked_mean(weights, mask).item()
        metrics["rollout_corr/is_weight_max"] = weights.max().item()
    new_mask = response_mask
    if config.rollout_rs is not None:
        bound = config.rollout_rs_threshold or config.rollout_is_threshold
        ratio = _ratio_at_level(log_ratio, mask, config.rollout_rs)
        keep = (ratio <= bound) & (ratio >= 1.0 / bound)
        new_mask = response_mask * keep.to(response_mask.dtype)
        rejected = mask.sum() - new_mask.float().sum()
        metrics["rollout_corr/rs_reject_frac"] = (rejected / mask.sum().clamp(min=1)).item()
    return weights, new_mask, metrics


def _ratio_at_level(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """(B, R) ratio per token, or each sequence's product broadcast to its tokens."""
    if level == "token":
        return log_ratio.exp()
    seq = _sequence_log_ratio(log_ratio, mask).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return seq.exp()[:, None].expand_as(log_ratio)


def _batch_mean(weights: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    if level == "token":
        return masked_mean(weights, mask)
    has_tokens = mask.sum(dim=-1) > 0
    return weights.max(dim=-1).values[has_tokens].mean()  # one weight per sequence, the same on all its tokens
