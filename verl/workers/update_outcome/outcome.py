"""What a backend reports after every optimizer step, and the error that stops training.

An :class:`UpdateOutcome` is built by the actor (or critic) from globally reduced values, so that every
data-parallel rank holds the same outcome for the same step. :class:`UpdateFailedError` is what a handler raises
when a failed update must end the run; its message is written for the person who reads the log: which model,
which step, why, the gradient norm and loss scale, and which config key to change.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import StrEnum

#: Config key that selects the policy for each role, named in every error message.
POLICY_CONFIG_KEYS = {
    "actor": "actor_rollout_ref.actor.update_failure_policy",
    "critic": "critic.update_failure_policy",
}


def policy_config_key(role: str) -> str:
    """The config key users set to choose the policy of ``role`` ("actor", "critic", ...)."""
    return POLICY_CONFIG_KEYS.get(role, f"{role}.update_failure_policy")


class FailureCause(StrEnum):
    """Why an update failed. Only a scaled-gradient overflow can be absorbed by backing off the loss scale.

    - ``scaled_grad_overflow``: inf/NaN in the loss-scaled fp16 gradients while the loss itself was finite: the
      scale is too high; the scaler backs off and the next update usually fits.
    - ``nonfinite_loss``: the unscaled loss was already inf/NaN (an fp16 forward overflow, a NaN log-prob from a
      kernel): no loss scale changes that; the scale is left as it was.
    - ``nonfinite_inputs``: the loss's inputs (rewards, advantages, returns, old / reference / rollout log-probs,
      values) held inf/NaN before any forward pass: a bug upstream (a scorer, the advantage estimator); nothing was
      computed and the scale is left as it was.
    - ``nonfinite_grads``: inf/NaN in the gradients without loss scaling (fp32, bf16) while the loss was finite.
    """

    SCALED_GRAD_OVERFLOW = "scaled_grad_overflow"
    NONFINITE_LOSS = "nonfinite_loss"
    NONFINITE_INPUTS = "nonfinite_inputs"
    NONFINITE_GRADS = "nonfinite_grads"


#: Causes a loss scaler can never absorb: the failure happened before any scaling.
UNSCALABLE_CAUSES = frozenset({FailureCause.NONFINITE_LOSS, FailureCause.NONFINITE_INPUTS})


@dataclass(frozen=True)
class UpdateOutcome:
    """The result of one attempted optimizer update.

    Attributes:
        successful: whether the optimizer applied the update.
        grad_norm: global gradient norm before clipping; None when it was not computed (megatron-core returns None
            when it skips an update on overflow).
        num_zeros_in_grad: number of zero gradient entries, when the backend counts them.
        loss_scale: the dynamic loss scale used for this step; None without dynamic loss scaling (fp32, bf16).
        min_loss_scale: the scaler's floor; None without dynamic loss scaling.
        step: 1-based count of attempted updates of this model.
        role: which model was updated ("actor", "critic").
        cause: why a failed update failed (a :class:`FailureCause`; None for a successful one). Left out, a failure
            is read as the gradient check saw it: a scaled-gradient overflow with a loss scale, non-finite
            gradients without one.
        nonfinite_inputs: for ``nonfinite_inputs``, the batch keys that held inf/NaN and on how many of their
            tokens, summed over the data-parallel ranks, e.g. ``{"token_level_rewards": 8}``.
    """

    successful: bool
    grad_norm: float | None
    num_zeros_in_grad: int | None
    loss_scale: float | None
    min_loss_scale: float | None
    step: int
    role: str = "actor"
    cause: FailureCause | None = None
    nonfinite_inputs: dict[str, int] | None = None

    def __post_init__(self):
        if not isinstance(self.step, int) or isinstance(self.step, bool) or self.step < 1:
            raise ValueError(f"UpdateOutcome.step is the 1-based count of attempted updates, got {self.step!r}.")
        if not isinstance(self.role, str) or not self.role:
            raise ValueError(f"UpdateOutcome.role must be a non-empty string, got {self.role!r}.")
        if self.successful:
            if self.cause is not None:
                raise ValueError(f"a successful UpdateOutcome has no failure cause, got {self.cause!r}.")
            return
        if self.cause is None:
            inferred = (
                FailureCause.SCALED_GRAD_OVERFLOW if self.loss_scale is not None else FailureCause.NONFINITE_GRADS
            )
            object.__setattr__(self, "cause", inferred)
        else:
            object.__setattr__(self, "cause", FailureCause(self.cause))  # a plain string from a custom backend

    @property
    def absorbable(self) -> bool:
        """True when the dynamic loss scaler could still back off after this step.

        That is the scaler finding its range (every fp16 run skips its first steps), not a broken run. Without a
        known floor the failure is never treated as absorbable: counting it is the safe side.
        """
        if self.cause in UNSCALABLE_CAUSES:
            return False  # the failure came before any scaling: no back-off can help
        if self.loss_scale is None or self.min_loss_scale is None:
            return False
        return self.loss_scale > self.min_loss_scale

    @property
    def failure_reason(self) -> str:
        """A short description of why the update failed ("" for a successful one), naming its cause."""
        if self.successful:
            return ""
        if self.cause == FailureCause.NONFINITE_INPUTS:
            where = ", ".join(f"{key} on {count} tokens" for key, count in (self.nonfinite_inputs or {}).items())
            return f"non-finite inputs to the loss ({where or 'unknown keys'}) [nonfinite_inputs]"
        if self.cause == FailureCause.NONFINITE_LOSS:
            return "non-finite loss before any loss scaling (inf/NaN from the forward pass) [nonfinite_loss]"
        if self.cause == FailureCause.SCALED_GRAD_OVERFLOW:
            return "gradient overflow (inf/NaN in the loss-scaled fp16 gradients) [scaled_grad_overflow]"
        if self.grad_norm is not None and not math.isfinite(self.grad_norm):
            return f"non-finite gradient norm ({self.grad_norm}) [nonfinite_grads]"
        return "non-finite gradients [nonfinite_grads]"

    def to_dict(self) -> dict:
        return asdict(self)


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.6g}"


def describe_outcome(outcome: UpdateOutcome) -> str:
    """One line with the numbers a reader needs: grad norm, loss scale and its floor."""
    return (
        f"grad_norm={_fmt(outcome.grad_norm)}, loss_scale={_fmt(outcome.loss_scale)}, "
        f"min_loss_scale={_fmt(outcome.min_loss_scale)}"
    )


class UpdateFailedError(RuntimeError):
    """Raised by an update-outcome handler to stop training.

    Args:
        message: the full explanation (what failed, the numbers, what to change).
        outcome: the outcome that triggered the stop, kept for programs that catch the error.
    """

    def __init__(self, message: str, outcome: UpdateOutcome | None = None):
        super().__init__(message)
        self.outcome = outcome

    @property
    def role(self) -> str | None:
        return None if self.outcome is None else self.outcome.role

    @property
    def step(self) -> int | None:
        return None if self.outcome is None else self.outcome.step

    def __reduce__(self):
        # Keep the outcome when the error crosses a process boundary (Ray pickles worker exceptions).
        return (type(self), (str(self), self.outcome))
