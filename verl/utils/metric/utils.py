"""Metric values collected over micro-batches and data-parallel ranks, and their reduction to one number each.

verl's import path for user code: ``from verl.utils.metric import Metric, AggregationType, reduce_metrics``.
A :class:`Metric` keeps its raw values and says how they combine (mean, sum, min, max); :func:`reduce_metrics`
turns a dict of such metrics (or plain lists, reduced by the key's name) into one value per key.
"""

from __future__ import annotations

import enum
import numbers
from typing import Any

import numpy as np
import torch

__all__ = ["AggregationType", "Metric", "reduce_metrics"]


class AggregationType(enum.Enum):
    """How the values of one :class:`Metric` combine into one number."""

    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


_REDUCERS = {
    AggregationType.MEAN: np.mean,
    AggregationType.SUM: np.sum,
    AggregationType.MIN: np.min,
    AggregationType.MAX: np.max,
}


def _as_number(value: Any) -> Any:
    """A scalar tensor becomes a Python number; a number stays as it is; anything else is refused."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"a metric value must be a scalar; got a tensor of shape {tuple(value.shape)}.")
        return value.detach().item()
    if isinstance(value, np.ndarray) and value.size == 1:
        return value.item()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return value
    raise ValueError(f"a metric value must be a number or a scalar tensor; got {type(value).__name__}.")


class Metric:
    """Values of one metric and how to combine them.

    Args:
        aggregation: ``"mean"``, ``"sum"``, ``"min"``, ``"max"`` or an :class:`AggregationType`.
        value: a first value, or a list of values, to hold from the start.

    Raises:
        ValueError: an unknown aggregation, or a value that is not a number or scalar tensor.
    """

    def __init__(self, aggregation: str | AggregationType, value: Any = None) -> None:
        try:
            self.aggregation = AggregationType(aggregation)
        except ValueError:
            accepted = [a.value for a in AggregationType]
            raise ValueError(f"aggregation={aggregation!r} is not supported; use one of {accepted}.") from None
        self.values: list[Any] = []
        if isinstance(value, list):
            self.extend(value)
        elif value is not None:
            self.append(value)

    def __repr__(self) -> str:
        return f"Metric({self.aggregation.value!r}, values={self.values!r})"

    def append(self, value: Any) -> None:
        """Add one value (a number or a scalar tensor), or all values of another metric."""
        if isinstance(value, Metric):
            self.extend(value)
        else:
            self.values.append(_as_number(value))

    def extend(self, values: Metric | list[Any]) -> None:
        """Add several values, or all values of a metric with the same aggregation."""
        if isinstance(values, Metric):
            if values.aggregation is not self.aggregation:
                raise ValueError(
                    f"cannot add a {values.aggregation.value} metric to a {self.aggregation.value} metric."
                )
            values = values.values
        for value in values:
            self.append(value)

    def aggregate(self) -> Any:
        """The held values combined by this metric's aggregation (NaN for a mean of nothing, as numpy gives)."""
        return _REDUCERS[self.aggregation](self.values)

    @classmethod
    def aggregate_dp(cls, metrics: list[Metric]) -> Any:
        """One value from the same metric on every data-parallel rank.

        Each rank holds one value per micro-batch, in the same order. Mean and sum first average each micro-batch's
        values over the ranks and then combine the averages; min and max take the extreme of all values.

        Raises:
            ValueError: no metrics, or ranks holding different numbers of values.
        """
        if not metrics:
            raise ValueError("aggregate_dp needs the metric of at least one rank.")
        counts = [len(m.values) for m in metrics]
        if len(set(counts)) != 1:
            raise ValueError(f"every rank must hold the same number of values to aggregate; got {counts}.")
        table = np.asarray([m.values for m in metrics])  # ranks x micro-batches
        aggregation = metrics[0].aggregation
        if aggregation in (AggregationType.MEAN, AggregationType.SUM):
            return _REDUCERS[aggregation](table.mean(axis=0))
        return _REDUCERS[aggregation](table.reshape(-1))

    @classmethod
    def from_dict(cls, data: dict[str, Any], aggregation: str | AggregationType) -> dict[str, Metric]:
        """One metric per key of ``data``, each holding that key's value(s)."""
        return {key: cls(aggregation, value) for key, value in data.items()}

    def init_list(self) -> Metric:
        """A new, empty metric with this one's aggregation."""
        return Metric(self.aggregation)


def reduce_metrics(metrics: dict[str, Metric | list[Any]]) -> dict[str, Any]:
    """Each entry reduced to one value, in place (and returned): a :class:`Metric` by its own aggregation; a list by
    its key's name: max for a key containing ``"max"``, min for one containing ``"min"``, else the mean."""
    for key, values in metrics.items():
        if isinstance(values, Metric):
            metrics[key] = values.aggregate()
        elif "max" in key:
            metrics[key] = np.max(values)
        elif "min" in key:
            metrics[key] = np.min(values)
        else:
            metrics[key] = np.mean(values)
    return metrics
