"""What one training step of a model returns: a typed :class:`UpdateResult`, read by code; metrics, read by people.

The update loop returns an :class:`UpdateResult` for every training step of a trained model (actor or critic). The
worker decides whether to send weights to a rollout engine from it, the driver decides whether the step updated
the policy from it, and the run's summary counts applied and skipped updates from it. Its ``metrics`` are for the
logs alone: no decision reads a metric's name, so renaming a metric never changes what the run does.

Every rank of a model reaches the same outcomes (they are computed from globally reduced values), so the result of
any rank speaks for the step; :func:`merge_rank_results` checks that and joins the ranks' metrics for logging.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from verl.workers.update_outcome.outcome import UpdateOutcome


@dataclass(frozen=True)
class UpdateResult:
    """One training step of one model.

    Attributes:
        role: the model's role ("actor", "critic"), the prefix of its metrics.
        outcomes: one :class:`UpdateOutcome` per optimizer update attempted in this step, in order (a step whose
            inputs were not finite has exactly one, failed, before any forward pass).
        num_attempted_total: updates attempted by this model since the run began (resumed parts included): the
            loop's step counter after this step.
        num_failed_total: updates that failed since the run began, as the update-failure policy counted them.
        metrics: the step's metrics, for logging only (``<role>/...`` and whatever the worker adds).
    """

    role: str
    outcomes: tuple[UpdateOutcome, ...]
    num_attempted_total: int
    num_failed_total: int
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def num_attempted(self) -> int:
        """Updates attempted in this step."""
        return len(self.outcomes)

    @property
    def num_successful(self) -> int:
        """Updates the optimizer applied in this step."""
        return sum(outcome.successful for outcome in self.outcomes)

    @property
    def updated(self) -> bool:
        """Whether at least one update of this step was applied (the weights changed)."""
        return self.num_successful > 0

    @property
    def num_applied_total(self) -> int:
        """Updates applied since the run began."""
        return self.num_attempted_total - self.num_failed_total

    def with_metrics(self, extra: dict[str, float]) -> UpdateResult:
        """The same result with ``extra`` added to its metrics (a worker's timings, memory)."""
        return replace(self, metrics={**self.metrics, **extra})


def merge_rank_results(
    results: Sequence[UpdateResult], reduce_metrics: Callable[[list[dict[str, float]]], dict[str, float]]
) -> UpdateResult:
    """One result for a step from every rank's: the ranks' outcomes must agree (they are computed from globally
    reduced values); the metrics are joined by ``reduce_metrics`` (e.g. the mean over ranks).

    Raises:
        ValueError: no result, or ranks that disagree on what happened (a bug: one rank would go on training while
            another stopped).
    """
    if not results:
        raise ValueError("merge_rank_results needs the result of at least one rank.")
    first = results[0]
    for other in results[1:]:
        same = (other.role, other.num_attempted_total, other.num_failed_total) == (
            first.role,
            first.num_attempted_total,
            first.num_failed_total,
        ) and [o.successful for o in other.outcomes] == [o.successful for o in first.outcomes]
        if not same:
            raise ValueError(
                f"{first.role}: ranks disagree on the step's updates ({first.num_successful} of {first.num_attempted} "
                f"applied on one rank, {other.num_successful} of {other.num_attempted} on another); every rank must "
                "reach the same outcome from globally reduced values."
            )
    return replace(first, metrics=reduce_metrics([r.metrics for r in results]))
