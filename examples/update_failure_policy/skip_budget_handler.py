"""An example update-failure policy: stop when the run has skipped too many updates the loss scaler did not absorb.

``fp16_warn_and_count`` stops on a *streak* of failed updates; this ``skip_budget`` policy stops on a *total*:
every failed update that the dynamic loss scaler could not absorb (the scale was already at its floor, or there is
no dynamic loss scaling) spends one unit of a budget of ``max_total_failures`` for the whole run, successes in
between or not. Failures the scaler absorbs (it could still back off) are free: every fp16 run has a dozen or more
of those while the scale comes down from its initial value.

Select it in the actor config (``module`` is imported in every worker process before the name is looked up)::

    actor_rollout_ref:
      actor:
        update_failure_policy:
          name: skip_budget
          module: examples.update_failure_policy.skip_budget_handler
          max_total_failures: 20
"""

from __future__ import annotations

import logging
from typing import Any

from verl.workers.update_outcome import (
    UpdateFailedError,
    UpdateOutcome,
    UpdateOutcomeHandler,
    policy_config_key,
    register_update_outcome_handler,
)

logger = logging.getLogger(__name__)


def _check_budget(value: Any) -> int:
    # bool is an int subclass: `max_total_failures: true` is a typo, not a budget of 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"skip_budget: max_total_failures must be an integer >= 1, got {value!r}.")
    return value


@register_update_outcome_handler("skip_budget")
class SkipBudgetHandler(UpdateOutcomeHandler):
    """Skip failed updates; raise once more than ``max_total_failures`` of them were not absorbed.

    Args:
        max_total_failures: how many failed updates not absorbed by the loss scaler the whole run may skip (>= 1).
            The next one raises :class:`UpdateFailedError`.
    """

    def __init__(self, max_total_failures: int = 100):
        super().__init__()
        self.max_total_failures = _check_budget(max_total_failures)
        self.num_unabsorbed_failures = 0

    def on_failure(self, outcome: UpdateOutcome) -> None:
        # The base class has already counted the failure (num_total_failures, num_consecutive_failures).
        if outcome.absorbable:
            logger.warning(
                "%s update failed at step %d: skipped while the loss scaler backs off.", outcome.role, outcome.step
            )
            return
        self.num_unabsorbed_failures += 1
        if self.num_unabsorbed_failures > self.max_total_failures:
            raise UpdateFailedError(
                f"{outcome.role} update failed at step {outcome.step}: {outcome.failure_reason}; "
                f"grad_norm={outcome.grad_norm}, loss_scale={outcome.loss_scale}; this is failure "
                f"{self.num_unabsorbed_failures} the loss scaler could not absorb, more than max_total_failures="
                f"{self.max_total_failures}. Check the learning rate and the data, or raise "
                f"{policy_config_key(outcome.role)}.max_total_failures.",
                outcome,
            )
        logger.warning(
            "%s update failed at step %d: skipped (%d of %d budgeted failures spent).",
            outcome.role,
            outcome.step,
            self.num_unabsorbed_failures,
            self.max_total_failures,
        )

    def metrics(self, outcome: UpdateOutcome) -> dict[str, float]:
        metrics = super().metrics(outcome)
        metrics[f"{outcome.role}/update_failures_unabsorbed_total"] = float(self.num_unabsorbed_failures)
        return metrics

    def metric_reductions(self) -> dict[str, str]:
        # a running count: the step reports where it stands after its last update, never an average
        return {**super().metric_reductions(), "update_failures_unabsorbed_total": "last"}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["num_unabsorbed_failures"] = self.num_unabsorbed_failures
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        # A checkpoint written under another policy lacks this counter; every failure so far is the safe bound.
        value = state.get("num_unabsorbed_failures", self.num_total_failures)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"skip_budget state 'num_unabsorbed_failures' must be an integer >= 0, got {value!r}.")
        self.num_unabsorbed_failures = value
