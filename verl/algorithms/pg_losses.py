"""Log-prob policy-gradient losses: GPG, DRO, DPPO (``dppo_tv``, ``dppo_kl``), REINFORCE and ``bypass_mode``.

These weight the gradient of log pi directly instead of a clipped ratio: GPG is the plain policy gradient, DRO adds
a quadratic penalty on the log-ratio, DPPO keeps a token only while its probability stays within a divergence
budget of the old policy's, and ``bypass_mode`` trains on the rollout engine's log-probs as the old ones, with
rollout correction. Calling convention, config reads and metric names as in :mod:`verl.algorithms.policy_losses`.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.algo_registry import clip_bounds, policy_loss_option, read_key
from verl.algorithms.loss_agg import loss_share
from verl.algorithms.policy_losses import clamped_log_ratio, compute_policy_loss_vanilla, register, weighted_agg
from verl.utils.torch_functional import masked_mean


@register("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG (arXiv:2504.02546): the plain policy gradient -A * log pi per token, no ratio and no clipping.

    Pair it with ``adv_estimator=gpg``, whose advantages carry the batch rescaling. ``old_log_prob`` is unused.

    Returns:
        ``(pg_loss, {})``.
    """
    return weighted_agg(-log_prob * advantages, response_mask, loss_agg_mode, config, rollout_is_weights), {}


@register("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Direct Reward Optimisation: -(A * log pi - beta / 2 * (log pi - log pi_old)^2) per token.

    The quadratic term keeps the policy near the one that sampled the data, in place of a clip; beta is
    ``config.policy_loss.dro_beta`` and must be set (> 0).

    Returns:
        ``(pg_loss, {"ppo_kl"})``.

    Raises:
        ValueError: when ``dro_beta`` is unset or not positive.
    """
    beta = policy_loss_option(config, "dro_beta")
    if beta is None or not beta > 0:
        raise ValueError(
            f"policy loss 'dro' needs actor_rollout_ref.actor.policy_loss.dro_beta > 0 (the weight of the quadratic "
            f"log-ratio penalty), got {beta!r}."
        )
    log_ratio = log_prob - old_log_prob
    per_token = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    pg_loss = weighted_agg(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, {"ppo_kl": masked_mean(-log_ratio, response_mask).item()}


def _dppo_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    keep: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO's loss once the kept tokens are known: -A * sg(min(r, clip_ratio_c)) * log pi on the kept tokens.

    The truncated ratio stands in for PPO's dual clip; DPPO's authors advise a large ``clip_ratio_c``.
    """
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = log_ratio.exp()
    clip_ratio_c = float(config.clip_ratio_c)
    truncated = ratio.clamp(max=clip_ratio_c).detach()
    keep = keep.detach().float()
    per_token = -advantages * truncated * log_prob * keep
    pg_loss = weighted_agg(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    metrics = {
        "pg_clipfrac": masked_mean(1.0 - keep, response_mask).item(),
        "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        "pg_clipfrac_lower": masked_mean((ratio > clip_ratio_c).float() * keep, response_mask).item(),
    }
    return pg_loss, metrics


@register("dppo_tv")
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO with the binary total-variation budget (arXiv:2602.04879).

    A token keeps its gradient while its probability has not moved past the budget in the advantage's direction:
    p - p_old <= high where A > 0, p - p_old >= -low elsewhere. Here ``clip_ratio`` / ``clip_ratio_low`` /
    ``clip_ratio_high`` are those probability budgets, not PPO ratio ranges.

    Returns:
        ``(pg_loss, {"pg_clipfrac" (share of dropped tokens), "ppo_kl", "pg_clipfrac_lower" (share of the valid
        tokens that were kept and had their ratio truncated at clip_ratio_c)})``.
    """
    low, high = clip_bounds(config, "dppo_tv")
    moved = log_prob.exp() - old_log_prob.exp()
    keep = torch.where(advantages > 0, moved <= high, moved >= -low)
    return _dppo_loss(
        old_log_prob, log_prob, advantages, response_mask, keep, loss_agg_mode, config, rollout_is_weights
    )


@register("dppo_kl")
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO with the binary KL budget (arXiv:2602.04879).

    The divergence is the KL between the Bernoulli distributions "this token / any other token" under the old and
    the new policy: p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p)). A token keeps its gradient while
    that KL is within budget (``high`` where A > 0, ``low`` elsewhere) or its probability moved against the
    advantage's direction (nothing to restrain then).

    Returns:
        As :func:`compute_policy_loss_dppo_tv`.
    """
    low, high = clip_bounds(config, "dppo_kl")
    prob, old_prob = log_prob.exp(), old_log_prob.exp()
    binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
    )
    keep_positive = (binary_kl <= high) | (prob <= old_prob)
    keep_negative = (binary_kl <= low) | (prob >= old_prob)
    keep = torch.where(advantages > 0, keep_positive, keep_negative)
    return _dppo_loss(
        old_log_prob, log_prob, advantages, response_mask, keep, loss_agg_mode, config, rollout_is_weights
    )


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE, optionally importance-weighted: -A * w * log pi per token (w = 1 without weights).

    With w = sg(pi / pi_rollout) (truncated) the gradient is the on-policy one, corrected for sampling from the
    rollout engine; no clipping. Not registered: ``bypass_mode`` with ``loss_type: reinforce`` calls it.

    Args:
        rollout_log_prob: (B, R) log-probs of the rollout engine; only for the ``ppo_kl`` metric.
        log_prob, advantages, response_mask: (B, R).
        loss_agg_mode: see :func:`agg_loss`.
        config: the actor config (for ``global_batch_info``; may be None).
        rollout_is_weights: optional (B, R) weights, used as constants.

    Returns:
        ``(pg_loss, {"ppo_kl"})``, ppo_kl the mean of log pi_rollout - log pi.
    """
    per_token = -advantages * log_prob
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights.detach()
    pg_loss = weighted_agg(per_token, response_mask, loss_agg_mode, config, None)
    return pg_loss, {"ppo_kl": masked_mean(rollout_log_prob - log_prob, response_mask).item()}


# verl's defaults of policy_loss.rollout_correction for bypass mode
_BYPASS_DEFAULTS = {
    "loss_type": "ppo_clip",
    "rollout_is": None,
    "rollout_is_threshold": 2.0,
    "rollout_is_batch_normalize": False,
    "rollout_rs": None,
    "rollout_rs_threshold": None,
}


@register("bypass_mode")
def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bypass mode: ``old_log_prob`` holds the rollout engine's log-probs, and rollout correction runs here.

    The settings come from ``config.policy_loss.rollout_correction`` (``loss_type``, ``rollout_is``,
    ``rollout_is_threshold``, ``rollout_is_batch_normalize``, ``rollout_rs``, ``rollout_rs_threshold``; see
    :func:`~verl.algorithms.rollout_corr_helper.compute_rollout_correction_and_rejection_mask`). The importance
    weights pi / pi_rollout and the rejection mask are computed from the current log-probs (detached); rejected
    tokens leave the loss but still count in its normaliser (the valid tokens, or sequences, of ``response_mask``),
    so that micro-batches add up to their mini-batch's loss. ``loss_type: ppo_clip`` runs
    :func:`compute_policy_loss_vanilla` against the rollout log-probs, without the weights, since its ratio already is
    pi / pi_rollout; ``reinforce`` runs :func:`compute_policy_loss_reinforce` with them. The ``rollout_is_weights``
    argument is ignored. ``rollout_is_batch_normalize`` normalises over the rows the loss is given (a micro-batch), as
    in verl, whose bypass loss also runs per micro-batch.

    Returns:
        ``(pg_loss, metrics)``: the chosen loss's metrics and the rollout-correction metrics (``rollout_corr/*``).

    Raises:
        ValueError: without ``policy_loss.rollout_correction``, or for an unknown ``loss_type``.
    """
    loss_type, settings = _bypass_settings(config)
    weights, kept_mask, correction_metrics = _bypass_correction(log_prob, old_log_prob, response_mask, settings)
    if loss_type == "reinforce":
        pg_loss, metrics = compute_policy_loss_reinforce(
            old_log_prob, log_prob, advantages, kept_mask, loss_agg_mode, config, weights
        )
    else:
        pg_loss, metrics = compute_policy_loss_vanilla(
            old_log_prob, log_prob, advantages, kept_mask, loss_agg_mode, config, None
        )
    # Rejected tokens leave the loss, not its normaliser: the loss above is normalised by the kept tokens (or
    # sequences); rescaled to this micro-batch's valid ones, the micro-batches add up to the mini-batch's loss over all
    # its valid tokens (UpdateLoop weights them by valid tokens), whatever rows each micro-batch holds and whichever
    # the rejection hit, as verl's loss normalised by the mini-batch's token count.
    pg_loss = pg_loss * loss_share(kept_mask, response_mask, loss_agg_mode)
    metrics.update(correction_metrics)
    return pg_loss, metrics


def _bypass_settings(config: Any) -> tuple[str, dict[str, Any]]:
    """Read bypass mode's ``policy_loss.rollout_correction`` section from the actor config.

    Returns:
        ``(loss_type, settings)``: the loss to run, and the keyword arguments of
        :func:`~verl.algorithms.rollout_corr_helper.compute_rollout_correction_and_rejection_mask`, with
        ``_BYPASS_DEFAULTS`` where the section leaves one out.

    Raises:
        ValueError: without ``policy_loss.rollout_correction``, or for an unknown ``loss_type``.
    """
    # verl's trainer attaches this to the actor config at run time in bypass mode; it is not a YAML key
    section = None if config is None else read_key(read_key(config, "policy_loss"), "rollout_correction")
    if section is None:
        raise ValueError(
            "policy loss 'bypass_mode' needs actor_rollout_ref.actor.policy_loss.rollout_correction (loss_type, "
            "rollout_is, rollout_is_threshold, rollout_rs, ...); set it, or use policy_loss 'vanilla'."
        )
    settings = {key: read_key(section, key, default) for key, default in _BYPASS_DEFAULTS.items()}
    loss_type = settings.pop("loss_type")
    if loss_type not in ("ppo_clip", "reinforce"):
        raise ValueError(
            f"policy_loss.rollout_correction.loss_type={loss_type!r} is not supported; use 'ppo_clip' or 'reinforce'."
        )
    return loss_type, settings


def _bypass_correction(
    log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor, settings: dict[str, Any]
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """Importance weights pi / pi_rollout and the rejection mask, from the detached current log-probs.

    Returns:
        ``(weights or None, kept mask, rollout-correction metrics)``; a micro-batch with no valid token keeps its
        mask and gets no weights or metrics, since there is nothing to weigh or reject.
    """
    from verl.algorithms.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    if not response_mask.any():
        return None, response_mask, {}
    with torch.no_grad():
        weights_proto, kept_mask, metrics = compute_rollout_correction_and_rejection_mask(
            log_prob.detach(), rollout_log_prob, response_mask, **settings
        )
    weights = None if weights_proto is None else weights_proto.batch["rollout_is_weights"]
    return weights, kept_mask, metrics
