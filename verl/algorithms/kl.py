"""KL estimators between the policy and the reference, the in-reward KL penalty and its coefficient controllers.

:func:`kl_penalty` serves both uses of KL in PPO-family training: the actor's KL loss
(``actor.kl_loss_type``) and the penalty subtracted from token rewards (``algorithm.kl_penalty`` with
:func:`compute_rewards`), whose coefficient a controller from :func:`get_kl_controller` keeps fixed or steers toward a
target. Re-exported by :mod:`verl.algorithms.core_algos` under verl's names.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

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
