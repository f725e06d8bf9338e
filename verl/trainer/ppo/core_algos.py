"""PPO-family maths: loss aggregation, KL estimators and controllers, policy and value losses, advantages.

Names, argument names and results follow the open-source verl project, so recipes written for verl's
``verl.trainer.ppo.core_algos`` run here unchanged. Policy losses and advantage estimators live in registries
(``register_policy_loss`` / ``register_adv_est``, looked up with ``get_policy_loss_fn`` / ``get_adv_estimator_fn``)
so recipes can add their own.

Config reads: policy losses take the actor config and read ``config.clip_ratio``, ``config.clip_ratio_low``,
``config.clip_ratio_high`` and ``config.clip_ratio_c`` as attributes; advantage estimators take the algorithm
config as ``config`` and read ``config.gamma``, ``config.lam`` and ``config.norm_adv_by_std_in_grpo`` when the
matching keyword argument is not passed; the KL controllers read ``type``, ``kl_coef``, ``target_kl`` and
``horizon`` from a ``kl_ctrl`` config. No value has a fallback default here: the YAML / config dataclasses hold
them. Every built-in estimator also accepts (and ignores) keyword arguments it does not use, so one trainer call
can serve them all.

Shapes: B sequences, R response tokens, V vocabulary entries.
"""

from __future__ import annotations

from collections import defaultdict
from enum import Enum
from typing import Any

import numpy as np
import torch

from verl.utils.registry import Registry
from verl.utils.torch_functional import entropy_from_logits, masked_mean, masked_sum, masked_whiten

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "agg_loss",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_policy_loss",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_value_loss",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "kl_penalty_forward",
    "register_adv_est",
    "register_policy_loss",
]

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


# ---------------------------------------------------------------------------------------------- aggregation


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss (B, R) into a scalar.

    Modes (``n_tok`` = valid tokens, ``n_seq`` = sequences with at least one valid token):

    - ``token-mean``: sum of valid token losses / ``batch_num_tokens`` (default: this batch's ``n_tok``).
    - ``seq-mean-token-sum``: per-sequence sums, summed / ``global_batch_size`` (default: this batch's ``n_seq``).
    - ``seq-mean-token-mean``: per-sequence means, summed / ``global_batch_size`` (default ``n_seq``).
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): the sum of all valid token losses / ``loss_scale_factor``
      (default R, the padded length); note there is no division by the number of sequences.

    The first three are multiplied by ``dp_size``: when ``batch_num_tokens`` / ``global_batch_size`` count the
    whole data-parallel batch, the gradient averaging over ``dp_size`` ranks then yields the global mean. Fully
    masked sequences never count; an empty batch gives 0 instead of NaN.

    Args:
        loss_mat: (B, R) per-token losses.
        loss_mask: (B, R) 1 for tokens that count.
        loss_agg_mode: one of :data:`LOSS_AGG_MODES`.
        dp_size: data-parallel world size the normalisers refer to.
        batch_num_tokens: token count to divide by in ``token-mean``.
        global_batch_size: sequence count to divide by in the ``seq-mean-*`` modes.
        loss_scale_factor: divisor of ``seq-mean-token-sum-norm``; keep it constant over training.

    Raises:
        ValueError: for an unknown ``loss_agg_mode``.
    """
    if loss_agg_mode == "token-mean":
        denominator = loss_mask.sum().clamp(min=1e-8) if batch_num_tokens is None else batch_num_tokens
        return masked_sum(loss_mat, loss_mask) / denominator * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        seq_tokens = loss_mask.sum(dim=-1)
        seq_losses = (loss_mat * loss_mask).sum(dim=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            seq_losses = seq_losses / (seq_tokens + 1e-8)
        seq_mask = (seq_tokens > 0).to(seq_losses.dtype)
        denominator = seq_mask.sum().clamp(min=1e-8) if global_batch_size is None else global_batch_size
        return masked_sum(seq_losses, seq_mask) / denominator * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        divisor = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        return (loss_mat * loss_mask).sum() / divisor
    raise ValueError(f"loss_agg_mode={loss_agg_mode!r} is not supported; use one of {list(LOSS_AGG_MODES)}.")


# ---------------------------------------------------------------------------------------------- KL

# Estimators of KL(pi || pi_ref) from per-token log-probs (http://joschu.net/blog/kl-approx.html). Appending "+"
# (e.g. "k3+") keeps the estimator's value but takes the gradient of k2, whose gradient is unbiased.
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate from the policy's and the reference's log-probs (B, R), without gradient tricks.

    ``kl``/``k1``: log p - log p_ref; ``abs``: its absolute value; ``mse``/``k2``: half its square;
    ``low_var_kl``/``k3``: r - log r - 1 with r = p_ref / p (log r clamped to [-20, 20], result to [-10, 10]).

    Raises:
        NotImplementedError: for ``full``, which needs the full (B, R, V) distributions, not log-probs.
        ValueError: for any other name.
    """
    diff = logprob - ref_logprob
    if kl_penalty in ("kl", "k1"):
        return diff
    if kl_penalty == "abs":
        return diff.abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * diff.square()
    if kl_penalty in ("low_var_kl", "k3"):
        # the clamps keep exp() finite when the policies disagree strongly on a token
        log_ratio = (-diff).clamp(min=-20, max=20)
        return (log_ratio.exp() - log_ratio - 1).clamp(min=-10, max=10)
    if kl_penalty == "full":
        raise NotImplementedError(
            "kl_penalty='full' needs the whole vocabulary distribution of both models, which the log-prob "
            f"interface does not carry; use one of {list(KL_TYPES)}."
        )
    raise ValueError(
        f"kl_penalty={kl_penalty!r} is not supported; use one of {list(KL_TYPES)}, optionally with a '+' suffix."
    )


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate (B, R) named by ``kl_penalty`` (see :func:`kl_penalty_forward`).

    A ``+`` suffix (``k1+``, ``k3+``, ``low_var_kl+``, ...) returns the named estimator's value with the
    gradient of ``k2`` (straight-through), because k1 and k3 are unbiased in value but not in gradient.

    Raises:
        NotImplementedError: for ``full``.
        ValueError: for an unknown name.
    """
    straight_through = kl_penalty.endswith("+")
    base = kl_penalty[:-1] if straight_through else kl_penalty
    forward = kl_penalty_forward(logprob, ref_logprob, base)
    if not straight_through or base in ("mse", "k2"):
        return forward
    backward = 0.5 * (logprob - ref_logprob).square()
    return backward - backward.detach() + forward.detach()


def compute_rewards(
    token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_ratio: float
) -> torch.Tensor:
    """Token-level rewards with an in-reward k1 KL penalty: scores - kl_ratio * (log p_old - log p_ref), (B, R)."""
    return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio


class FixedKLController:
    """A constant KL coefficient ``value``."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient never changes."""


class AdaptiveKLController:
    """Moves the KL coefficient so that the observed KL tracks ``target_kl`` (Ziegler et al., 2019).

    Each update multiplies ``value`` by ``1 + clip(current_kl / target_kl - 1, -0.2, 0.2) * n_steps / horizon``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value, self.target, self.horizon = init_kl_coef, target_kl, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adjust ``value`` after ``n_steps`` samples whose mean KL was ``current_kl``."""
        error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + error * n_steps / self.horizon


def get_kl_controller(kl_ctrl: Any) -> FixedKLController | AdaptiveKLController:
    """Build the KL controller described by a ``kl_ctrl`` config (read by attribute: ``type``, ``kl_coef`` and,
    for ``adaptive``, ``target_kl`` and ``horizon``).

    Raises:
        ValueError: for an unknown ``type`` or a non-positive ``horizon``.
    """
    if kl_ctrl.type == "fixed":
        return FixedKLController(kl_coef=float(kl_ctrl.kl_coef))
    if kl_ctrl.type == "adaptive":
        if not kl_ctrl.horizon > 0:
            raise ValueError(
                f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {kl_ctrl.horizon}."
            )
        return AdaptiveKLController(
            init_kl_coef=float(kl_ctrl.kl_coef), target_kl=float(kl_ctrl.target_kl), horizon=int(kl_ctrl.horizon)
        )
    raise ValueError(f"algorithm.kl_ctrl.type={kl_ctrl.type!r} is not supported; use 'fixed' or 'adaptive'.")


# ---------------------------------------------------------------------------------------------- policy losses

POLICY_LOSS_REGISTRY = Registry("policy loss", config_key="actor_rollout_ref.actor.policy_loss")


def register_policy_loss(name: str):
    """Decorator registering a policy loss under ``name``.

    The function is called as ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=...,
    config=<actor config>, rollout_is_weights=None)`` with (B, R) tensors and returns ``(loss, metrics)``, a
    scalar tensor and a dict of floats (the actor prefixes the metric names with its role).
    """
    return POLICY_LOSS_REGISTRY.register(name)


def get_policy_loss_fn(name: str):
    """The policy loss registered as ``name``.

    Raises:
        ValueError: unknown name; the message lists the registered ones.
    """
    return POLICY_LOSS_REGISTRY.get(name)


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
    # clamping the log-ratio keeps exp() finite for tokens whose probability moved a lot
    log_ratio = (log_prob - old_log_prob).clamp(min=-20.0, max=20.0)
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


@register_policy_loss("vanilla")
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
    if config is None:
        raise ValueError(
            "The 'vanilla' policy loss needs the actor config (config=actor_rollout_ref.actor) for its clip ratios."
        )
    clip_ratio = config.clip_ratio
    low = clip_ratio if config.clip_ratio_low is None else config.clip_ratio_low
    high = clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
    per_token, clipfrac, ppo_kl, clipfrac_lower = _clipped_surrogate(
        old_log_prob, log_prob, advantages, response_mask, low, high, float(config.clip_ratio_c)
    )
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights
    pg_loss = agg_loss(per_token, response_mask, loss_agg_mode)
    metrics = {"pg_clipfrac": clipfrac.item(), "ppo_kl": ppo_kl.item(), "pg_clipfrac_lower": clipfrac_lower.item()}
    return pg_loss, metrics


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Mean categorical entropy of the response tokens, aggregated by ``loss_agg_mode``.

    Args:
        logits: (B, R, V).
        response_mask: (B, R).
    """
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss 0.5 * agg(max((v - G)^2, (clip(v, v_old +- c) - G)^2)).

    Args:
        vpreds: (B, R) new value predictions; returns: (B, R) targets; values: (B, R) old predictions.
        response_mask: (B, R).
        cliprange_value: how far a prediction may move from the old value before clipping.

    Returns:
        ``(vf_loss, vf_clipfrac)``: the scalar loss and the fraction of tokens where the clipped term won.
    """
    clipped = values + (vpreds - values).clamp(-cliprange_value, cliprange_value)
    loss_unclipped = (vpreds - returns).square()
    loss_clipped = (clipped - returns).square()
    vf_loss = 0.5 * agg_loss(torch.maximum(loss_unclipped, loss_clipped), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac


# ---------------------------------------------------------------------------------------------- advantages


class AdvantageEstimator(str, Enum):
    """Names of the built-in advantage estimators (``algorithm.adv_estimator``); plain strings work too."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REMAX = "remax"
    RLOO = "rloo"
    GRPO_VECTORIZED = "grpo_vectorized"


ADV_ESTIMATOR_REGISTRY = Registry("advantage estimator", config_key="algorithm.adv_estimator")


def _estimator_name(name_or_enum: str | Enum) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def register_adv_est(name_or_enum: str | AdvantageEstimator):
    """Decorator registering an advantage estimator under a name (or an :class:`AdvantageEstimator`).

    The estimator is called with keyword arguments (``token_level_rewards``, ``response_mask``, ``config``, and
    where available ``index``, ``values``, ``reward_baselines``, ...) and returns ``(advantages, returns)``, both
    (B, R). Registering the same function twice is a no-op; a different function under a taken name is an error.
    """
    return ADV_ESTIMATOR_REGISTRY.register(_estimator_name(name_or_enum))


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator):
    """The advantage estimator registered under a name or :class:`AdvantageEstimator`.

    Raises:
        ValueError: unknown name; the message lists the registered ones.
    """
    return ADV_ESTIMATOR_REGISTRY.get(_estimator_name(name_or_enum))


def _from_config(value: Any, config: Any, attribute: str, estimator: str) -> Any:
    """An explicitly passed value, else ``config.<attribute>``; the message names the config key when neither."""
    if value is not None:
        return value
    if config is None:
        raise ValueError(
            f"{estimator} needs {attribute}: pass {attribute}=... or config=<algorithm config> (algorithm.{attribute})."
        )
    return getattr(config, attribute)


@register_adv_est(AdvantageEstimator.GAE)
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
    gamma = float(_from_config(gamma, config, "gamma", "compute_gae_advantage_return"))
    lam = float(_from_config(lam, config, "lam", "compute_gae_advantage_return"))
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


def _group_rows(index: Any) -> dict[Any, list[int]]:
    """Row ids per group label, in first-seen order."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, uid in enumerate(np.asarray(index, dtype=object).tolist()):
        groups[uid].append(i)
    return groups


def _resolve_norm_by_std(norm_adv_by_std_in_grpo: bool | None, config: Any) -> bool:
    if norm_adv_by_std_in_grpo is not None:
        return bool(norm_adv_by_std_in_grpo)
    if config is not None:
        return bool(config.norm_adv_by_std_in_grpo)
    return True  # the original GRPO


@register_adv_est(AdvantageEstimator.GRPO)
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

    A sample's score is the sum of its token-level rewards; groups are the samples sharing an ``index`` label
    (the prompt's uid). The std is the unbiased (Bessel-corrected) one. A group of one gets mean 0 and std 1, so
    its advantage is its score.

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
    norm_by_std = _resolve_norm_by_std(norm_adv_by_std_in_grpo, config)
    scores = token_level_rewards.sum(dim=-1)
    normalised = torch.zeros_like(scores)
    for rows in _group_rows(index).values():
        group = scores[rows]
        if len(rows) == 1:
            mean, std = torch.zeros((), dtype=scores.dtype), torch.ones((), dtype=scores.dtype)
        else:
            mean, std = group.mean(), group.std()
        centred = group - mean
        normalised[rows] = centred / (std + epsilon) if norm_by_std else centred
    advantages = normalised.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)
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
    norm_by_std = _resolve_norm_by_std(norm_adv_by_std_in_grpo, config)
    scores = token_level_rewards.sum(dim=-1)
    groups = _group_rows(index)
    group_id = torch.empty(scores.shape[0], dtype=torch.long)
    for gid, rows in enumerate(groups.values()):
        group_id[rows] = gid
    group_id = group_id.to(scores.device)
    num_groups = len(groups)
    # statistics in float64: two-pass (mean, then squared deviations) so low-precision scores stay accurate
    scores64 = scores.double()
    counts = torch.zeros(num_groups, dtype=torch.float64, device=scores.device).index_add_(
        0, group_id, torch.ones_like(scores64)
    )
    mean = torch.zeros_like(counts).index_add_(0, group_id, scores64) / counts
    squared = (scores64 - mean[group_id]).square()
    var = torch.zeros_like(counts).index_add_(0, group_id, squared) / (counts - 1).clamp(min=1)
    single = counts == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(var), var.sqrt())
    centred = scores64 - mean[group_id]
    normalised = centred / (std[group_id] + epsilon) if norm_by_std else centred
    advantages = normalised.to(scores.dtype).unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.RLOO)
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
    for rows in _group_rows(index).values():
        n = len(rows)
        if n > 1:
            group = scores[rows]
            out[rows] = group * n / (n - 1) - group.mean() * n / (n - 1)
    advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    gamma: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted reward-to-go per token, whitened over the batch's valid tokens.

    Args:
        token_level_rewards, response_mask: (B, R).
        config: the algorithm config; ``config.gamma`` is the discount unless ``gamma`` is passed.
        gamma: explicit discount (overrides the config).

    Returns:
        ``(advantages, returns)``, (B, R); advantages are 0 on padding.
    """
    gamma = float(_from_config(gamma, config, "gamma", "compute_reinforce_plus_plus_outcome_advantage"))
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[-1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * response_mask[:, t]  # no credit flows back across padding
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.REMAX)
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
    masked = token_level_rewards * response_mask
    returns = masked.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns
