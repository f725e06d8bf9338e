"""Reducing a training step's metrics: each metric says how it reduces over the step's updates.

A step makes several updates (mini-batches x epochs) and each reports metrics. Most are averaged; a counter must
keep its last value (an average of 3, 4, 5 failures is no count), and a 0/1 flag wants its maximum ("did any
update fail"). Whoever reports a metric says which, with the metric: :class:`StepMetrics` keeps the reduction
that came with each name (mean unless told otherwise); nobody else keeps a list of names.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

REDUCTIONS = ("mean", "max", "min", "last", "sum")


class StepMetrics:
    """Collects metric values over a step and reduces each by its own rule."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = defaultdict(list)
        self.reductions: dict[str, str] = {}

    def add(self, metrics: Mapping[str, float | None], reductions: Mapping[str, str] | None = None) -> None:
        """Record one value per metric; ``reductions`` maps names to one of :data:`REDUCTIONS` (default mean).

        Raises:
            ValueError: an unknown reduction, or a name whose reduction changes within the step.
        """
        for name, how in (reductions or {}).items():
            if how not in REDUCTIONS:
                raise ValueError(f"metric {name!r}: unknown reduction {how!r}; use one of {list(REDUCTIONS)}.")
            if self.reductions.setdefault(name, how) != how:
                raise ValueError(f"metric {name!r} is reduced by {self.reductions[name]!r} and {how!r} in one step.")
        for name, value in metrics.items():
            if value is not None:
                self.values[name].append(float(value))

    def reduce(self) -> dict[str, float]:
        """One number per metric."""
        reduced = {}
        for name, values in self.values.items():
            how = self.reductions.get(name, "mean")
            if how == "mean":
                reduced[name] = sum(values) / len(values)
            elif how == "max":
                reduced[name] = max(values)
            elif how == "min":
                reduced[name] = min(values)
            elif how == "sum":
                reduced[name] = sum(values)
            else:
                reduced[name] = values[-1]
        return reduced
