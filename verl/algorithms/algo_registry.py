"""The two algorithm registries (policy losses, advantage estimators), the estimator names, and config readers.

The modules that define the built-in losses and estimators register them here at import time;
:mod:`verl.algorithms.core_algos` re-exports the registries under verl's names and adds the public
``register_*`` / ``get_*`` functions. The config readers are shared by those modules: the built-ins read the actor
config (losses) or the ``algorithm`` config (estimators) by attribute or key, as verl's do, with no fallback: every
key they read is in the YAML config, and a config without it is refused with the key named.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from verl.utils.registry import Registry

POLICY_LOSS_REGISTRY = Registry("policy loss", config_key="actor_rollout_ref.actor.policy_loss")
ADV_ESTIMATOR_REGISTRY = Registry("advantage estimator", config_key="algorithm.adv_estimator")


class AdvantageEstimator(str, Enum):
    """Names of the built-in advantage estimators (``algorithm.adv_estimator``); plain strings work too."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"
    GDPO = "gdpo"


# Losses that aggregate their own way whatever ``loss_agg_mode`` says: their name -> how they aggregate, an
# ``agg_loss`` mode or "row-mean" (the plain mean over every row, empty ones included). The update loop weighs
# micro-batches by this, so that accumulated gradients equal the whole mini-batch's.
FIXED_LOSS_AGGREGATION: dict[str, str] = {}


def loss_aggregation(loss_mode: str, loss_agg_mode: str) -> str:
    """How the policy loss ``loss_mode`` aggregates when the config says ``loss_agg_mode``."""
    return FIXED_LOSS_AGGREGATION.get(loss_mode, loss_agg_mode)


def estimator_name(name_or_enum: str | Enum) -> str:
    """The registry key of an estimator given by name or by an enum member."""
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def read_key(section: Any, key: str, default: Any = None) -> Any:
    """``section[key]`` for a mapping, ``section.<key>`` otherwise; ``default`` when absent."""
    if isinstance(section, Mapping):
        return section.get(key, default)
    return getattr(section, key, default)


_MISSING = object()


def _require(section: Any, key: str, full_key: str, what: str) -> Any:
    value = _MISSING if section is None else read_key(section, key, _MISSING)
    if value is _MISSING:
        raise ValueError(f"{what} reads {full_key}, and the config handed to it has no such key; pass that config.")
    return value


def policy_loss_option(config: Any, key: str) -> Any:
    """``config.policy_loss.<key>`` of the actor config (an object or a mapping, as in verl).

    Raises:
        ValueError: the config (or its ``policy_loss`` section) lacks the key.
    """
    section = None if config is None else read_key(config, "policy_loss")
    return _require(section, key, f"actor_rollout_ref.actor.policy_loss.{key}", "this policy loss")


def actor_option(config: Any, key: str) -> Any:
    """A top-level actor key (``tau_pos``, ``loss_scale_factor``, ...).

    Raises:
        ValueError: the config lacks the key.
    """
    return _require(config, key, f"actor_rollout_ref.actor.{key}", "this policy loss")


def algorithm_option(config: Any, key: str) -> Any:
    """An ``algorithm`` key (``gdpo_reward_keys``, ...).

    Raises:
        ValueError: the config lacks the key.
    """
    return _require(config, key, f"algorithm.{key}", "this advantage estimator")


def global_batch_info(config: Any) -> dict[str, Any]:
    """The keyword arguments a loss forwards to ``agg_loss``: ``loss_scale_factor`` from the actor config, and the
    whole-batch normalisers verl's trainers attach at run time as ``config.global_batch_info`` (a run-time
    attribute, not a config key, hence read only when present)."""
    if config is None:
        return {}
    info = dict(read_key(config, "global_batch_info") or {})
    if "loss_scale_factor" not in info:
        info["loss_scale_factor"] = actor_option(config, "loss_scale_factor")
    return info


def clip_bounds(config: Any, loss_name: str) -> tuple[float, float]:
    """(low, high) clip ranges from the actor config: ``clip_ratio_low`` / ``clip_ratio_high``, else ``clip_ratio``.

    Raises:
        ValueError: without a config.
    """
    if config is None:
        raise ValueError(
            f"The {loss_name!r} policy loss needs the actor config (config=actor_rollout_ref.actor) for its clip "
            f"ratios."
        )
    low, high = config.clip_ratio_low, config.clip_ratio_high
    return (config.clip_ratio if low is None else low), (config.clip_ratio if high is None else high)
