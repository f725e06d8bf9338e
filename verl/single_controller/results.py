"""Collecting the results of a worker-group call, and telling a worker's error from a dead worker.

:func:`get_all` waits for every rank of a call. A worker's exception comes back on the driver as the same type
with the same message (callers ``except`` the project's own errors), the lowest failed rank's, with the other
ranks' failures folded in or logged. A rank whose process is gone (killed, crashed, its node lost) outranks every
other failure, since the others' errors (a collective that lost its peer) follow from it: it is reported as
:class:`WorkerDiedError` naming the group, the rank and the node. Once one rank failed the others get a bounded
grace period, so a rank stuck in a collective with a dead peer never hangs the driver. A rank that hangs while
the others wait for it in a collective is found the same way: when a rank's error is a collective timeout
(:func:`~verl.single_controller.worker.is_collective_timeout`), the ranks that did not time out (still running
after the grace period, or finished without waiting) are the ones the others waited for, reported as
:class:`CollectiveTimeoutError`.
:class:`PendingResult` is a call in flight: it collects with :func:`get_all` and records the call's timing.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayActorError, RayTaskError

from verl.single_controller.timing import CallTiming
from verl.single_controller.transport import unpack
from verl.single_controller.worker import is_collective_timeout

logger = logging.getLogger(__name__)

# After one rank fails, how long to wait for the others: they may be stuck in a collective with the failed rank.
ERROR_GRACE_S = 10.0
# After one rank died, how long to wait for the others to be reported: a lost node takes all of its ranks at once,
# and the lowest dead rank is reported. The living ones need not finish: the group is torn down anyway.
DEATH_GRACE_S = 2.0
# What a rank gets when it reaches a collective its peers already gave up on: a consequence of a timeout, not a cause.
_PEER_GAVE_UP = re.compile(
    r"Connection closed by peer|Connection reset by peer|Application timeout caused pair closure"
)


class WorkerDiedError(RuntimeError):
    """A rank's process is gone (killed, crashed, or its node lost); its group cannot go on and must be rebuilt.

    Attributes:
        role: the group's name prefix (``actor_rollout_ref``, ``critic``, ...).
        rank: the dead rank (the lowest one when several died together).
        node_id: the Ray node id the rank ran on.
        node_ip: that node's IP.
        reason: Ray's account of the death.
    """

    #: what happened to the rank, in the messages: "worker <role> rank <R> on node <id> (<ip>) <event>: <reason>"
    event = "died"

    def __init__(self, role: str, rank: int, node_id: str, node_ip: str, reason: str) -> None:
        self.role, self.rank, self.node_id, self.node_ip, self.reason = role, rank, node_id, node_ip, reason
        super().__init__(f"worker {role} rank {rank} on node {node_id} ({node_ip}) {self.event}: {reason}")

    def __reduce__(self):
        return type(self), (self.role, self.rank, self.node_id, self.node_ip, self.reason)


class CollectiveTimeoutError(WorkerDiedError):
    """The other ranks waited for this rank in a collective until their timeout ran out (``trainer.
    collective_timeout_s``): it hangs, or is far slower than them. The group's process group is broken after a
    timeout, so, like a death, the group must be rebuilt (``trainer.max_restarts`` covers both).

    Attributes: those of :class:`WorkerDiedError`; ``rank`` is the lowest rank the others waited for.
    """

    event = "hung in a collective"


class GenerationTimeoutError(WorkerDiedError):
    """A rollout rank returned no samples within ``trainer.collective_timeout_s`` of the trainer asking for them (the
    rollout group of its own, ``hybrid_engine=false``): it hangs, or is far slower than the bound. The run stops
    rather than wait for ever; like a death, the groups are rebuilt when ``trainer.max_restarts`` allows.

    Attributes: those of :class:`WorkerDiedError`; ``rank`` is the lowest rank that had not returned.
    """

    event = "returned no samples in time"


def death_reason(err: RayActorError) -> str:
    """Ray's account of a death in one line: without the actor's id fields (the rank and node say more), the
    opening sentence every death repeats, and the list of common causes."""
    lines = [line.strip() for line in str(err).splitlines()]
    fields = ("class_name:", "actor_id:", "pid:", "name:", "namespace:", "ip:")
    text = " ".join(line for line in lines if line and not line.startswith(fields))
    text = text.replace(ActorDiedError.BASE_ERROR_MSG, "").split(" Some common causes")[0].strip()
    return text or type(err).__name__


def _unwrap_task_error(err: RayTaskError, rank: int) -> BaseException:
    """The worker's own exception, with the remote traceback and the rank attached, or ``err`` itself."""
    cause = getattr(err, "cause", None)
    if not isinstance(cause, BaseException) or isinstance(cause, RayTaskError):
        return err
    try:
        cause.remote_traceback = getattr(err, "traceback_str", str(err))
        cause.rank = rank
    except AttributeError:  # exception types with __slots__ cannot take attributes; the type and message survive
        pass
    return cause


def get_all(
    refs: list,
    ranks: list[int],
    on_death: Callable[[int, RayActorError], BaseException] | None = None,
    on_hang: Callable[[list[int], dict[int, BaseException], list[int]], BaseException] | None = None,
) -> list:
    """``ray.get`` every ref; on failure, re-raise the most telling error.

    A dead rank (its process gone) outranks every other failure, since the others' errors (a collective that lost
    its peer) follow from it: the lowest dead rank is raised, as ``on_death(rank, err)`` builds it (Ray's own
    error without it). Next, collective timeouts: when some ranks' errors are collective timeouts, ``on_hang`` is
    given and no other rank failed on its own (a late rank's "connection closed by peer" follows from the timeout),
    ``on_hang(awaited, timed_out, still_running)`` is raised, where ``awaited`` are the ranks that did not time out
    (those the others waited for; the ones still running first, then the ones that returned, then the ones that
    found their peers gone), ``timed_out`` the timeout errors by rank, and ``still_running`` the ranks
    unfinished after the grace period; a rank that failed on its own is the cause, and its error is raised as
    below. Otherwise the lowest failed rank's exception is re-raised as its own
    type; ranks that raise the same type and message are folded into it, other failures are logged. Once a rank
    failed, the others get ``ERROR_GRACE_S`` seconds to finish (``DEATH_GRACE_S`` once one died).

    Raises:
        BaseException: the dead rank's error, the hang's, or the worker's exception (same type and message) with
            ``remote_traceback`` and ``rank``.
    """
    outputs, errors, deaths, still_running = _wait_for_ranks(refs, ranks)
    if deaths:
        dead_rank = min(deaths)
        for rank, err in sorted(errors.items()):
            logger.info("rank %d failed after rank %d died: %s: %s", rank, dead_rank, type(err).__name__, err)
        if len(deaths) > 1:
            logger.warning("ranks %s died together", sorted(deaths))
        if on_death is None:
            raise deaths[dead_rank]
        raise on_death(dead_rank, deaths[dead_rank]) from None
    if not errors:
        return outputs
    timed_out = {rank: err for rank, err in errors.items() if is_collective_timeout(err)}
    if timed_out and on_hang is not None:
        # a rank that failed on its own (not because its peers gave up) is why the others waited: report its error
        causes = {r: e for r, e in errors.items() if r not in timed_out and not _PEER_GAVE_UP.search(str(e))}
        if not causes:
            raise on_hang(_awaited_ranks(ranks, errors, timed_out, still_running), timed_out, still_running) from None
        for rank in sorted(timed_out):
            logger.info("rank %d timed out in a collective, waiting for a rank that failed", rank)
        errors = causes
    first_rank = min(errors)
    first = errors[first_rank]
    for rank, err in sorted(errors.items()):
        if rank != first_rank and (type(err), str(err)) != (type(first), str(first)):
            logger.warning("rank %d also failed: %s: %s", rank, type(err).__name__, err)
    raise first.with_traceback(None)


def _wait_for_ranks(refs: list, ranks: list[int]):
    """Wait for every ref; after the first failure, only for the grace period. Returns ``(outputs, errors by rank,
    deaths by rank, the ranks still running when the wait ended, in order)``."""
    index_of = {ref: i for i, ref in enumerate(refs)}
    outputs: list[Any] = [None] * len(refs)
    errors: dict[int, BaseException] = {}
    deaths: dict[int, RayActorError] = {}
    pending, deadline = list(refs), None
    while pending:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
        if not ready:
            logger.warning("%d rank(s) had not finished when the failure was reported", len(pending))
            break
        i = index_of[ready[0]]
        try:
            outputs[i] = ray.get(ready[0])
        except RayActorError as err:
            if err.actor_init_failed:  # the constructor raised: an error of the code, not a death to recover from
                errors[ranks[i]] = err
                deadline = deadline or time.monotonic() + ERROR_GRACE_S
            else:
                deaths[ranks[i]] = err
                death_deadline = time.monotonic() + DEATH_GRACE_S
                deadline = death_deadline if deadline is None else min(deadline, death_deadline)
        except RayTaskError as err:
            errors[ranks[i]] = _unwrap_task_error(err, ranks[i])
            deadline = deadline or time.monotonic() + ERROR_GRACE_S
    return outputs, errors, deaths, sorted(ranks[index_of[ref]] for ref in pending)


def _awaited_ranks(
    ranks: list[int], errors: dict[int, BaseException], timed_out: dict[int, BaseException], still_running: list[int]
) -> list[int]:
    """The ranks the ones that timed out waited for, the likeliest culprit first: a rank still running (it hangs),
    then one that returned without joining, then one that only found its peers gone (a ring neighbour of the ranks
    that timed out, late or not)."""
    returned = sorted(rank for rank in ranks if rank not in errors and rank not in still_running)
    late = sorted(rank for rank in errors if rank not in timed_out)
    return still_running + returned + late


class PendingResult:
    """The result of a group call; ``get()`` waits for every rank, collects, and records the call's timing.

    The refs are of :meth:`~verl.single_controller.worker.Worker.run_timed` calls, ``(result, seconds)`` per rank.
    """

    def __init__(
        self,
        refs: list,
        ranks: list[int],
        collect: Callable[[list], Any],
        on_death: Callable | None = None,
        on_timing: Callable[[CallTiming], None] | None = None,
        start: float | None = None,
        on_hang: Callable | None = None,
    ) -> None:
        self._refs, self._ranks, self._collect, self._on_death = refs, ranks, collect, on_death
        self._on_timing, self._on_hang = on_timing, on_hang
        self._start = time.perf_counter() if start is None else start  # perf_counter() when the call began

    def unfinished_ranks(self, timeout_s: float) -> list[int]:
        """Wait up to ``timeout_s`` seconds for every rank; the ranks that have not finished by then (none: ``get``
        returns without waiting)."""
        _, pending = ray.wait(list(self._refs), num_returns=len(self._refs), timeout=timeout_s)
        waiting = set(pending)
        return [rank for ref, rank in zip(self._refs, self._ranks, strict=True) if ref in waiting]

    def get(self) -> Any:
        timed = get_all(self._refs, self._ranks, self._on_death, self._on_hang)
        result = self._collect([unpack(output) for output, _ in timed])
        if self._on_timing is not None:
            self._on_timing(CallTiming(time.perf_counter() - self._start, max(seconds for _, seconds in timed)))
        return result
