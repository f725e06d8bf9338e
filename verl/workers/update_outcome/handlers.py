"""The built-in update-outcome policies, registered side by side.

``strict`` stops on the first failed update: right for fp32 and bf16, where a failed update means the gradients
went non-finite and something is broken. ``fp16_warn_and_count`` is the fp16 policy: failed updates are expected
while the dynamic loss scaler backs off from its high initial scale, so each one is skipped with a warning and
counted, and the run stops only when failures persist beyond what the scaler can absorb.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.workers.update_outcome.base import UpdateOutcomeHandler, read_counter, register_update_outcome_handler
from verl.workers.update_outcome.outcome import (
    UNSCALABLE_CAUSES,
    FailureCause,
    UpdateFailedError,
    UpdateOutcome,
    describe_outcome,
    policy_config_key,
)

#: Where to look, per cause, in the message that stops a run.
_WHERE_TO_LOOK = {
    FailureCause.NONFINITE_INPUTS: (
        "The loss's inputs held inf/NaN before any forward pass, so no loss scale or retry can help: look at what "
        "produced them (the reward function for token_level_rewards/scores, the advantage estimator for "
        "advantages/returns, the rollout or reference pass for the log-probs, the critic for values)."
    ),
    FailureCause.NONFINITE_LOSS: (
        "The loss was inf/NaN before loss scaling, so backing the scale off cannot help: look for a forward-pass "
        "overflow (fp16 activations or logits: try bf16 or a lower learning rate) or a kernel returning NaN "
        "log-probs (use_fused_kernels, use_torch_compile, use_remove_padding)."
    ),
}


def _where_to_look(outcome: UpdateOutcome, default: str) -> str:
    return _WHERE_TO_LOOK.get(outcome.cause, default)


logger = logging.getLogger(__name__)


@register_update_outcome_handler("strict")
class StrictHandler(UpdateOutcomeHandler):
    """Raise :class:`UpdateFailedError` on any failed update."""

    def on_failure(self, outcome: UpdateOutcome) -> None:
        key = policy_config_key(outcome.role)
        advice = _where_to_look(
            outcome,
            f"For fp16 training, where the loss scaler's first skipped steps are expected, set "
            f"{key}=fp16_warn_and_count (or auto); otherwise look for the source of the non-finite gradients "
            f"(learning rate, data, dtype).",
        )
        raise UpdateFailedError(
            f"{outcome.role} update failed at step {outcome.step}: {outcome.failure_reason}; "
            f"{describe_outcome(outcome)}; failures: {self.num_consecutive_failures} consecutive, "
            f"{self.num_total_failures} in total. The update-failure policy is 'strict', which stops on the first "
            f"failed update. {advice}",
            outcome,
        )


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"fp16_warn_and_count: {name} must be an integer >= {minimum}, got {value!r}.")
    if value < minimum:
        raise ValueError(f"fp16_warn_and_count: {name} must be >= {minimum}, got {value}.")
    return value


@register_update_outcome_handler("fp16_warn_and_count")
class FP16WarnAndCountHandler(UpdateOutcomeHandler):
    """Skip failed updates with a warning; stop when too many in a row were not absorbed by the loss scaler.

    A failure is absorbed when the dynamic loss scaler could still back off (``loss_scale > min_loss_scale``):
    the scaler is still finding its range. Failures at the floor, or without dynamic loss scaling, are not
    absorbed. A successful update resets both consecutive counts. A failure no loss scale can fix (its cause is
    ``nonfinite_loss`` or ``nonfinite_inputs``: the loss or its inputs were already inf/NaN) stops the run at once,
    naming the cause and where it came from.

    Args:
        max_consecutive_failures: raise when more than this many consecutive failures were not absorbed (>= 1).
        ignore_loss_scale_backoff: when False, every failure counts towards the limit, absorbed or not.
    """

    def __init__(self, max_consecutive_failures: int = 10, ignore_loss_scale_backoff: bool = True):
        super().__init__()
        self.max_consecutive_failures = _check_int("max_consecutive_failures", max_consecutive_failures, 1)
        if not isinstance(ignore_loss_scale_backoff, bool):
            raise ValueError(
                f"fp16_warn_and_count: ignore_loss_scale_backoff must be true or false, got "
                f"{ignore_loss_scale_backoff!r}."
            )
        self.ignore_loss_scale_backoff = ignore_loss_scale_backoff
        self.num_consecutive_unabsorbed = 0

    def _absorbed(self, outcome: UpdateOutcome) -> bool:
        return self.ignore_loss_scale_backoff and outcome.absorbable

    def on_success(self, outcome: UpdateOutcome) -> None:
        self.num_consecutive_unabsorbed = 0

    def on_failure(self, outcome: UpdateOutcome) -> None:
        absorbed = self._absorbed(outcome)
        if not absorbed:
            self.num_consecutive_unabsorbed += 1
        counts = (
            f"{self.num_consecutive_failures} consecutive ({self.num_consecutive_unabsorbed} not absorbed by the "
            f"loss scaler), {self.num_total_failures} in total"
        )
        if outcome.cause in UNSCALABLE_CAUSES:
            raise UpdateFailedError(
                f"{outcome.role} update failed at step {outcome.step}: {outcome.failure_reason}; "
                f"{describe_outcome(outcome)}; failures: {counts}. The loss scale was left as it was, and "
                f"fp16_warn_and_count stops at once on this cause. {_where_to_look(outcome, '')}",
                outcome,
            )
        if self.num_consecutive_unabsorbed > self.max_consecutive_failures:
            key = policy_config_key(outcome.role)
            raise UpdateFailedError(
                f"{outcome.role} update failed at step {outcome.step}: {outcome.failure_reason}; "
                f"{describe_outcome(outcome)}; failures: {counts}. That is more than max_consecutive_failures="
                f"{self.max_consecutive_failures} consecutive failures the loss scaler could not absorb, so the "
                f"gradients are not recovering. Check the learning rate, the data and min_loss_scale; to allow more, "
                f"raise {key}.max_consecutive_failures.",
                outcome,
            )
        note = "skipped while the loss scaler backs off" if absorbed else "skipped"
        logger.warning(
            "%s update failed at step %d (%s): %s; %s; failures: %s.",
            outcome.role,
            outcome.step,
            note,
            outcome.failure_reason,
            describe_outcome(outcome),
            counts,
        )

    def metrics(self, outcome: UpdateOutcome) -> dict[str, float]:
        metrics = super().metrics(outcome)
        metrics[f"{outcome.role}/update_failures_unabsorbed"] = float(self.num_consecutive_unabsorbed)
        return metrics

    def metric_reductions(self) -> dict[str, str]:
        return {**super().metric_reductions(), "update_failures_unabsorbed": "last"}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["num_consecutive_unabsorbed"] = self.num_consecutive_unabsorbed
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        # A checkpoint written under another policy has no such counter: the consecutive count is the safe bound.
        if "num_consecutive_unabsorbed" not in state:
            self.num_consecutive_unabsorbed = self.num_consecutive_failures
            return
        unabsorbed = read_counter(state, "num_consecutive_unabsorbed", type(self).__name__)
        if unabsorbed > self.num_consecutive_failures:
            raise ValueError(
                f"{type(self).__name__} state has num_consecutive_unabsorbed={unabsorbed} > "
                f"num_consecutive_failures={self.num_consecutive_failures}; the checkpoint is inconsistent."
            )
        self.num_consecutive_unabsorbed = unabsorbed
