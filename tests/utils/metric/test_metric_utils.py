"""verl.utils.metric: Metric, AggregationType and reduce_metrics under verl's import path."""

import math

import numpy as np
import pytest
import torch

from verl.utils.metric import AggregationType, Metric, reduce_metrics


def test_metric_aggregates_by_its_type():
    values = [1.0, torch.tensor(5.0), np.array([3.0])]
    # mean (1 + 5 + 3) / 3 = 3, sum 9, min 1, max 5
    expected = {"mean": 3.0, "sum": 9.0, "min": 1.0, "max": 5.0}
    for name, result in expected.items():
        assert Metric(name, list(values)).aggregate() == pytest.approx(result)
    assert Metric(AggregationType.SUM, 2).values == [2]
    assert math.isnan(Metric("mean").aggregate())


def test_metric_refuses_bad_values_and_mixing():
    with pytest.raises(ValueError, match="median"):
        Metric("median")
    with pytest.raises(ValueError, match="scalar"):
        Metric("mean", torch.ones(2))
    with pytest.raises(ValueError, match="cannot add"):
        Metric("mean", 1).extend(Metric("sum", 2))


def test_aggregate_dp_averages_ranks_per_micro_batch_for_mean_and_sum():
    ranks = [Metric("sum", [1.0, 3.0]), Metric("sum", [3.0, 5.0])]
    # per micro-batch rank means: 2 and 4; their sum 6
    assert Metric.aggregate_dp(ranks) == pytest.approx(6.0)
    # max over all four values
    assert Metric.aggregate_dp([Metric("max", [1.0, 3.0]), Metric("max", [3.0, 5.0])]) == 5.0
    with pytest.raises(ValueError, match="same number"):
        Metric.aggregate_dp([Metric("mean", [1.0]), Metric("mean", [1.0, 2.0])])


def test_reduce_metrics_uses_metric_type_or_key_name():
    reduced = reduce_metrics(
        {"loss": [1.0, 3.0], "grad/max": [1.0, 7.0], "len/min": [4, 2], "tokens": Metric("sum", [2, 3])}
    )
    assert reduced == {"loss": 2.0, "grad/max": 7.0, "len/min": 2, "tokens": 5}
    built = Metric.from_dict({"a": [1, 2], "b": 4}, "max")
    assert built["a"].aggregate() == 2 and built["b"].init_list().values == []
