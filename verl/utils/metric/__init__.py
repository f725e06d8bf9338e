"""Metric helpers under verl's import path (``verl.utils.metric``); see :mod:`verl.utils.metric.utils`."""

from verl.utils.metric.utils import AggregationType, Metric, reduce_metrics

__all__ = ["AggregationType", "Metric", "reduce_metrics"]
