"""PPO-family maths under verl's names: loss aggregation, KL, policy and value losses, advantage estimators.

This module is the public face verl users import, under verl's path ``verl.trainer.ppo.core_algos`` (the same
module object; it lives here, below the workers that compute the losses). The code lives in the modules beside it:
:mod:`~verl.algorithms.loss_agg` (aggregation, entropy and value losses), :mod:`~verl.algorithms.kl` (KL
estimators and controllers), :mod:`~verl.algorithms.policy_losses`, :mod:`~verl.algorithms.pg_losses` and
:mod:`~verl.algorithms.cov_losses` (policy losses), :mod:`~verl.algorithms.advantages`,
:mod:`~verl.algorithms.group_advantages` and :mod:`~verl.algorithms.token_baselines` (advantage estimators).
Policy losses and estimators live in registries
that recipes extend with ``register_policy_loss`` / ``register_adv_est`` and look up with ``get_policy_loss_fn`` /
``get_adv_estimator_fn``. Those four functions use the table this module holds *at call time*
(``POLICY_LOSS_REGISTRY`` / ``ADV_ESTIMATOR_REGISTRY``), so code that swaps in a plain dict, as verl's own tests do,
keeps working. Config reads: losses take the actor config, estimators the algorithm config, both by attribute;
losses that aggregate their own way whatever ``loss_agg_mode`` says are in ``FIXED_LOSS_AGGREGATION``. Shapes: B
sequences, R response tokens, V vocabulary entries.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping

from verl.algorithms.advantages import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
)
from verl.algorithms.algo_registry import (
    ADV_ESTIMATOR_REGISTRY,
    FIXED_LOSS_AGGREGATION,
    POLICY_LOSS_REGISTRY,
    AdvantageEstimator,
    estimator_name,
    loss_aggregation,
)
from verl.algorithms.cov_losses import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov
from verl.algorithms.group_advantages import (
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from verl.algorithms.kl import (
    KL_TYPES,
    AdaptiveKLController,
    FixedKLController,
    compute_rewards,
    get_kl_controller,
    kl_penalty,
    kl_penalty_forward,
)
from verl.algorithms.loss_agg import LOSS_AGG_MODES, agg_loss, compute_entropy_loss, compute_value_loss, loss_share
from verl.algorithms.pg_losses import (
    compute_policy_loss_bypass_mode,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_gpg,
    compute_policy_loss_reinforce,
)
from verl.algorithms.policy_losses import (
    compute_policy_loss,
    compute_policy_loss_cispo,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gspo,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
)
from verl.algorithms.token_baselines import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from verl.utils.registry import Registry

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "FIXED_LOSS_AGGREGATION",
    "KL_TYPES",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "agg_loss",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_policy_loss",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_value_loss",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "kl_penalty_forward",
    "loss_aggregation",
    "loss_share",
    "register_adv_est",
    "register_policy_loss",
]

Table = Registry | MutableMapping


def _names(table: Table) -> list[str]:
    return table.names() if isinstance(table, Registry) else sorted(table)


def _add(table: Table, name: str, fn: Callable, kind: str) -> Callable:
    """Register ``fn`` in a :class:`Registry` (its duplicate rule) or in a plain dict (the same rule, by identity)."""
    if isinstance(table, Registry):
        return table.add(name, fn)
    current = table.get(name)
    if current is not None and current is not fn:
        raise ValueError(f"Cannot register {fn!r} as {kind} {name!r}: the name is taken by {current!r}.")
    table[name] = fn
    return fn


def _lookup(table: Table, name: str) -> Callable | None:
    if name not in table:
        return None
    return table.get(name) if isinstance(table, Registry) else table[name]


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering a policy loss under ``name`` (the value of ``actor.policy_loss``).

    The function is called as ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode=...,
    config=<actor config>, rollout_is_weights=None)`` with (B, R) tensors and returns ``(loss, metrics)``, a
    scalar tensor and a dict of floats (the actor prefixes the metric names with its role). Registering the same
    function twice is a no-op; a different function under a taken name is a ``ValueError``.
    """
    return lambda fn: _add(POLICY_LOSS_REGISTRY, name, fn, "policy loss")


def get_policy_loss_fn(name: str) -> Callable:
    """The policy loss registered as ``name``.

    Raises:
        ValueError: unknown name; the message lists the registered ones.
    """
    fn = _lookup(POLICY_LOSS_REGISTRY, name)
    if fn is None:
        raise ValueError(
            f"Unsupported loss mode: {name!r} (config key `actor_rollout_ref.actor.policy_loss`). Supported modes "
            f"are: {', '.join(_names(POLICY_LOSS_REGISTRY))}; register your own with @register_policy_loss(name)."
        )
    return fn


def register_adv_est(name_or_enum: str | AdvantageEstimator) -> Callable[[Callable], Callable]:
    """Decorator registering an advantage estimator under a name (or an :class:`AdvantageEstimator`).

    The estimator is called with keyword arguments (``token_level_rewards``, ``response_mask``, ``config``, and
    where available ``index``, ``values``, ``reward_baselines``, ...) and returns ``(advantages, returns)``, both
    (B, R). Registering the same function twice is a no-op; a different function under a taken name is a
    ``ValueError``.
    """
    name = estimator_name(name_or_enum)
    return lambda fn: _add(ADV_ESTIMATOR_REGISTRY, name, fn, "advantage estimator")


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> Callable:
    """The advantage estimator registered under a name or :class:`AdvantageEstimator`.

    Raises:
        ValueError: unknown name; the message lists the registered ones.
    """
    name = estimator_name(name_or_enum)
    fn = _lookup(ADV_ESTIMATOR_REGISTRY, name)
    if fn is None:
        # the message opens with verl's wording, which verl users' tests match
        raise ValueError(
            f"Unknown advantage estimator simply: {name} (config key `algorithm.adv_estimator`). Registered: "
            f"{', '.join(_names(ADV_ESTIMATOR_REGISTRY)) or '(none)'}; register your own with @register_adv_est(name)."
        )
    return fn
