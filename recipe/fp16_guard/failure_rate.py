"""The ``failure_rate`` update-failure policy: stop when too large a share of the recent updates failed.

``fp16_warn_and_count`` stops on a streak of failed updates, so a run that fails every other update never stops.
This policy looks at a sliding window instead: it keeps the last ``window`` updates as 0 (applied) / 1 (failed)
and stops training with :class:`UpdateFailedError` when the failed fraction of that window exceeds
``max_failure_rate``. It decides only once ``min_updates`` updates are in the window (by default the full window),
so one early failure is not a 100% rate. Failures the dynamic loss scaler absorbs (it could still back off, which
every fp16 run does for its first dozen or so steps) count as applied unless ``count_absorbed`` is true.

Select it with ``module:`` so that every Ray worker imports this file before the name is looked up::

    actor_rollout_ref.actor.update_failure_policy:
      {name: failure_rate, module: recipe.fp16_guard.failure_rate, window: 8, max_failure_rate: 0.5}
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from verl.workers.update_outcome import (
    UpdateFailedError,
    UpdateOutcome,
    UpdateOutcomeHandler,
    policy_config_key,
    register_update_outcome_handler,
)
from verl.workers.update_outcome.outcome import describe_outcome

logger = logging.getLogger(__name__)

NAME = "failure_rate"


def _check_int(param: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    # bool is an int subclass: `window: true` is a typo, not a window of 1.
    bounds = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{NAME}: {param} must be an integer {bounds}, got {value!r}.")
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{NAME}: {param} must be an integer {bounds}, got {value}.")
    return value


def _check_rate(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{NAME}: max_failure_rate must be a number with 0 < max_failure_rate < 1, got {value!r}.")
    if not 0.0 < value < 1.0:
        # A rate of 1 could never be exceeded, so the policy would never stop: almost certainly not what was meant.
        raise ValueError(
            f"{NAME}: max_failure_rate must satisfy 0 < max_failure_rate < 1 (the failed fraction of the window "
            f"that is tolerated), got {value}. For example 0.5 stops when more than half the updates failed."
        )
    return float(value)


@register_update_outcome_handler(NAME)
class FailureRateHandler(UpdateOutcomeHandler):
    """Skip failed updates; raise once the failed fraction of the last ``window`` updates exceeds a limit.

    Args:
        window: how many of the most recent updates the rate is computed over (integer >= 1).
        max_failure_rate: the largest tolerated failed fraction, 0 < max_failure_rate < 1; a larger one raises.
        min_updates: updates needed in the window before the policy decides (1..window); None -> ``window``.
        count_absorbed: when False, failures the loss scaler absorbs (``outcome.absorbable``) count as applied.
    """

    def __init__(
        self,
        window: int = 50,
        max_failure_rate: float = 0.5,
        min_updates: int | None = None,
        count_absorbed: bool = False,
    ):
        super().__init__()
        self.window = _check_int("window", window, 1)
        self.max_failure_rate = _check_rate(max_failure_rate)
        if min_updates is None:
            min_updates = self.window
        self.min_updates = _check_int("min_updates", min_updates, 1, self.window)
        if not isinstance(count_absorbed, bool):
            raise ValueError(f"{NAME}: count_absorbed must be true or false, got {count_absorbed!r}.")
        self.count_absorbed = count_absorbed
        # 1 = a failure that counts, 0 = applied (or absorbed); the oldest entry falls out when the window is full.
        self.recent: deque[int] = deque(maxlen=self.window)

    @property
    def failure_rate(self) -> float:
        """The failed fraction of the updates in the window (0.0 while it is empty)."""
        return sum(self.recent) / len(self.recent) if self.recent else 0.0

    def on_success(self, outcome: UpdateOutcome) -> None:
        self.recent.append(0)
        # The window may just have reached min_updates with earlier failures in it: decide on this step too.
        self._check(outcome)

    def on_failure(self, outcome: UpdateOutcome) -> None:
        counted = self.count_absorbed or not outcome.absorbable
        self.recent.append(1 if counted else 0)
        self._check(outcome)
        note = "counted" if counted else "absorbed by the loss scaler, not counted"
        logger.warning(
            "%s update failed at step %d (%s): %s; %s; failure rate %.3g over the last %d updates (limit %.3g).",
            outcome.role,
            outcome.step,
            note,
            outcome.failure_reason,
            describe_outcome(outcome),
            self.failure_rate,
            len(self.recent),
            self.max_failure_rate,
        )

    def _check(self, outcome: UpdateOutcome) -> None:
        if len(self.recent) < self.min_updates or self.failure_rate <= self.max_failure_rate:
            return
        this_step = f"failed: {outcome.failure_reason}" if not outcome.successful else "was applied"
        absorbed = "" if self.count_absorbed else " (failures absorbed by the loss scaler not counted)"
        key = policy_config_key(outcome.role)
        raise UpdateFailedError(
            f"{outcome.role} update failure rate too high at step {outcome.step}: {sum(self.recent)} of the last "
            f"{len(self.recent)} updates failed{absorbed}, a rate of {self.failure_rate:.3g}, more than "
            f"max_failure_rate={self.max_failure_rate:g} over window={self.window}. This step's update "
            f"{this_step}; {describe_outcome(outcome)}; failures: {self.num_consecutive_failures} consecutive, "
            f"{self.num_total_failures} in total. Look for the source of the non-finite gradients (learning rate, "
            f"data, min_loss_scale), or allow more with {key}.max_failure_rate / {key}.window.",
            outcome,
        )

    def metrics(self, outcome: UpdateOutcome) -> dict[str, float]:
        metrics = super().metrics(outcome)
        metrics[f"{outcome.role}/update_failure_rate"] = float(self.failure_rate)
        return metrics

    def metric_reductions(self) -> dict[str, str]:
        # a windowed rate: the step reports the window as it stands after its last update, never an average
        return {**super().metric_reductions(), "update_failure_rate": "last"}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["window"] = list(self.recent)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the counters and the window.

        A checkpoint written under another policy has no window: the rate starts afresh (and waits for
        ``min_updates`` again). A longer saved window than the configured one keeps its most recent entries.

        Raises:
            ValueError: the saved window is not a list of 0/1.
        """
        super().load_state_dict(state)
        saved = state.get("window")
        if saved is None:
            logger.warning("%s: the checkpoint has no failure window (another policy wrote it); starting empty.", NAME)
            saved = []
        entries = [v.item() if hasattr(v, "item") else v for v in saved] if isinstance(saved, list | tuple) else None
        if entries is None or any(isinstance(v, bool) or v not in (0, 1) for v in entries):
            raise ValueError(f"{NAME} state 'window' must be a list of 0/1 entries, got {saved!r}.")
        self.recent = deque((int(v) for v in entries), maxlen=self.window)
