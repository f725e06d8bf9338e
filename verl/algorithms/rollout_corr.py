"""The training-inference mismatch: how far the rollout engine's probabilities are from the trainer's.

The rollout engine samples each response token from its own distribution mu and reports log mu of it
(``rollout_log_probs``); the trainer computes pi_old of the same tokens (``old_log_probs``). Both should be the same
policy, but they compute differently (precision, kernels, batch shapes), and bf16's short mantissa makes them
disagree far more than fp16's (Qi et al., 2025). :func:`compute_mismatch_metrics` measures the gap every step, with
verl's metric names. The correction (``algorithm.rollout_correction``: importance weights, rejection, bypass mode)
is in :mod:`verl.algorithms.rollout_corr_helper`.

All functions take (B, R) float tensors and a (B, R) 0/1 ``response_mask``; positions outside the mask never count.
"""

from __future__ import annotations

import torch

from verl.algorithms.rollout_corr_metrics import compute_offpolicy_metrics


def compute_mismatch_metrics(
    rollout_log_probs: torch.Tensor, trainer_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """verl's mismatch metrics between the engine (mu) and the trainer (pi), over the response tokens.

    With p = exp(log p) per token: ``training/rollout_probs_diff_mean``, ``_max``, ``_std`` (of |p_mu - p_pi|) and
    ``training/rollout_actor_probs_pearson_corr`` (of p_mu and p_pi), and every off-policy metric of
    :func:`~verl.algorithms.rollout_corr_metrics.compute_offpolicy_metrics` under ``rollout_corr/``
    (``kl``, ``k3_kl``, ``training_ppl``, ``rollout_ppl``, ``ppl_ratio``, ``log_ppl_diff``, ``chi2_token``, ...).

    Args:
        rollout_log_probs: (B, R) log mu of the sampled tokens.
        trainer_log_probs: (B, R) log pi of the same tokens.
        response_mask: (B, R) 0/1.

    Returns:
        The metrics as floats ({} when the mask is empty).
    """
    mask = response_mask.float()
    if mask.sum() == 0:
        return {}
    mu, pi = rollout_log_probs.float(), trainer_log_probs.float()
    valid = mask.bool()
    p_mu, p_pi = mu.exp()[valid], pi.exp()[valid]
    diff = (p_mu - p_pi).abs()
    metrics = {
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_probs_diff_std": diff.std(unbiased=False).item(),
        "training/rollout_actor_probs_pearson_corr": _pearson(p_mu, p_pi),
    }
    metrics.update({f"rollout_corr/{k}": float(v) for k, v in compute_offpolicy_metrics(pi, mu, mask).items()})
    return metrics


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two 1-D samples; 1.0 when either is constant and they are equal, else 0.0."""
    xc, yc = x - x.mean(), y - y.mean()
    denominator = (xc.square().sum() * yc.square().sum()).sqrt()
    if denominator == 0:
        return 1.0 if torch.equal(x, y) else 0.0
    return ((xc * yc).sum() / denominator).item()
