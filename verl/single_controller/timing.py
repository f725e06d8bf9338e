"""Where the time of a worker-group call goes: the call's wall time against the slowest rank's time in the method.

Every group call runs through the worker's ``run_timed``, which reports the seconds spent inside the method; the
driver measures the call from dispatch to the collected result. :class:`CallTiming` holds the two for one call
and :class:`CallTimings` keeps them per method until the trainer pops them once a step (it logs the difference as
``timing_s/overhead/<method>``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CallTiming:
    """Where the time of one group call went.

    Attributes:
        wall_s: from the driver's call to the collected result (dispatch, transfers, work, collect).
        worker_s: the slowest rank's time inside the method.
    """

    wall_s: float
    worker_s: float

    @property
    def overhead_s(self) -> float:
        """What the call cost beyond the work itself: splitting, serialising, moving and merging the data."""
        return max(self.wall_s - self.worker_s, 0.0)


class CallTimings:
    """The timings of a group's calls since the last :meth:`pop`, by method name, in call order."""

    def __init__(self) -> None:
        self._by_method: dict[str, list[CallTiming]] = {}

    def recorder(self, method_name: str) -> Callable[[CallTiming], None]:
        """A function that records one call of ``method_name`` (handed to the call's pending result)."""

        def record(timing: CallTiming) -> None:
            self._by_method.setdefault(method_name, []).append(timing)

        return record

    def peek(self) -> dict[str, list[CallTiming]]:
        """The timings recorded so far, left in place."""
        return {name: list(timings) for name, timings in self._by_method.items()}

    def pop(self) -> dict[str, list[CallTiming]]:
        """The timings recorded so far; the next pop starts from nothing."""
        timings, self._by_method = self._by_method, {}
        return timings
