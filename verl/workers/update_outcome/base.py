"""The update-outcome handler base class and its registry.

A handler sees every :class:`UpdateOutcome` of one model, in step order, and returns the metrics of that step
or raises :class:`UpdateFailedError`. The base class owns the bookkeeping every policy needs (step order, failure
counters, the metric names, checkpoint state), so a policy only decides what a failure means in
:meth:`UpdateOutcomeHandler.on_failure`. Handlers must be deterministic functions of the outcomes they have seen:
that is what lets every data-parallel rank reach the same decision at the same step.
"""

from __future__ import annotations

from typing import Any

from verl.utils.registry import Registry
from verl.workers.update_outcome.outcome import FailureCause, UpdateOutcome

UPDATE_OUTCOME_HANDLER_REGISTRY: Registry[type[UpdateOutcomeHandler]] = Registry(
    "update-outcome handler", config_key="actor_rollout_ref.actor.update_failure_policy"
)


class UpdateOutcomeHandler:
    """Base class of update-outcome handlers.

    Subclasses take their own parameters as keyword arguments in ``__init__`` (validated there, raising
    ``ValueError``), implement :meth:`on_failure`, and extend :meth:`state_dict` / :meth:`load_state_dict` when
    they keep counters of their own.

    Counters kept here:
        num_total_failures: failed updates since the start of training.
        num_consecutive_failures: failed updates since the last successful one.
        last_step: the step of the last outcome handled (0 before the first).
        failures_by_cause: failed updates since the start of training, per :class:`FailureCause` value.
    """

    def __init__(self):
        self.num_total_failures = 0
        self.num_consecutive_failures = 0
        self.last_step = 0
        self.failures_by_cause = {cause.value: 0 for cause in FailureCause}

    def handle(self, outcome: UpdateOutcome) -> dict[str, float]:
        """Record ``outcome``, apply the policy, and return this step's metrics.

        Raises:
            UpdateFailedError: the policy decided that training must stop.
            ValueError: ``outcome.step`` does not follow the last handled step (an outcome is counted once).
        """
        if outcome.step <= self.last_step:
            raise ValueError(
                f"{outcome.role} update step {outcome.step} was already handled (last handled step: "
                f"{self.last_step}); each outcome must be handed to the handler exactly once."
            )
        self.last_step = outcome.step
        if outcome.successful:
            self.num_consecutive_failures = 0
            self.on_success(outcome)
        else:
            self.num_total_failures += 1
            self.num_consecutive_failures += 1
            self.failures_by_cause[outcome.cause.value] += 1
            self.on_failure(outcome)
        return self.metrics(outcome)

    def on_success(self, outcome: UpdateOutcome) -> None:
        """Hook for a successful update (counters are already updated)."""

    def on_failure(self, outcome: UpdateOutcome) -> None:
        """Decide what a failed update means: return to skip it, raise ``UpdateFailedError`` to stop."""
        raise NotImplementedError(f"{type(self).__name__} must implement on_failure(outcome).")

    def metrics(self, outcome: UpdateOutcome) -> dict[str, float]:
        """The metrics of this step, prefixed with the outcome's role."""
        prefix = outcome.role
        metrics = {
            f"{prefix}/update_failed": 0.0 if outcome.successful else 1.0,
            f"{prefix}/update_failures_consecutive": float(self.num_consecutive_failures),
            f"{prefix}/update_failures_total": float(self.num_total_failures),
        }
        for cause, count in self.failures_by_cause.items():
            if count:  # a cause appears from its first failure on
                metrics[f"{prefix}/update_failures/{cause}"] = float(count)
        if outcome.loss_scale is not None:
            metrics[f"{prefix}/loss_scale"] = float(outcome.loss_scale)
        return metrics

    def metric_reductions(self) -> dict[str, str]:
        """How each metric of :meth:`metrics` reduces over a training step's updates, by name without the role prefix.

        ``"last"`` for counters (a step reports where the count stands), ``"max"`` for 0/1 flags (did any update
        fail), ``"mean"`` (the default for names not listed). A subclass that adds metrics extends the dict::

            def metric_reductions(self):
                return {**super().metric_reductions(), "update_failure_rate": "last"}
        """
        return {
            "update_failed": "max",
            "update_failures_consecutive": "last",
            "update_failures_total": "last",
            **{f"update_failures/{cause.value}": "last" for cause in FailureCause},
            "loss_scale": "last",
        }

    def state_dict(self) -> dict[str, Any]:
        """The counters, as plain Python numbers (safe for ``torch.load(weights_only=True)``)."""
        return {
            "num_total_failures": self.num_total_failures,
            "num_consecutive_failures": self.num_consecutive_failures,
            "last_step": self.last_step,
            "failures_by_cause": dict(self.failures_by_cause),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the counters saved by :meth:`state_dict`.

        Raises:
            ValueError: a counter is missing or is not a non-negative integer.
        """
        for key in ("num_total_failures", "num_consecutive_failures", "last_step"):
            setattr(self, key, read_counter(state, key, type(self).__name__))
        # a checkpoint from before the causes were told apart has no per-cause counts: they start from zero
        by_cause = state.get("failures_by_cause")
        self.failures_by_cause = {cause.value: 0 for cause in FailureCause}
        if by_cause is None:
            return
        for cause in by_cause:
            if cause not in self.failures_by_cause:
                raise ValueError(f"{type(self).__name__} state counts failures of an unknown cause {cause!r}.")
            self.failures_by_cause[cause] = read_counter(by_cause, cause, type(self).__name__)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.state_dict()})"


def read_counter(state: dict[str, Any], key: str, owner: str) -> int:
    if key not in state:
        raise ValueError(f"{owner} state is missing {key!r}; got keys {sorted(state)}.")
    value = state[key]
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{owner} state {key!r} must be a non-negative integer, got {value!r}.")
    return value


def register_update_outcome_handler(name: str):
    """Class decorator: register an :class:`UpdateOutcomeHandler` subclass under ``name``.

    Registering the same class twice is a no-op; a different class under a taken name is a ``ValueError``.
    """

    def decorator(cls: type[UpdateOutcomeHandler]) -> type[UpdateOutcomeHandler]:
        if not (isinstance(cls, type) and issubclass(cls, UpdateOutcomeHandler)):
            raise ValueError(f"Only UpdateOutcomeHandler subclasses can be registered as {name!r}, got {cls!r}.")
        return UPDATE_OUTCOME_HANDLER_REGISTRY.add(name, cls)

    return decorator


def get_update_outcome_handler_cls(name: str) -> type[UpdateOutcomeHandler]:
    """The handler class registered under ``name``; unknown names raise ``ValueError`` listing the known ones."""
    return UPDATE_OUTCOME_HANDLER_REGISTRY.get(name)


def list_update_outcome_handlers() -> list[str]:
    """The registered handler names, sorted."""
    return UPDATE_OUTCOME_HANDLER_REGISTRY.names()
