"""Ray-backed worker groups: N actors of one ``Worker`` subclass driven from the single controller.

``RayResourcePool`` says how many workers, on how many nodes, and what each one needs; it reserves one placement
group per node (see ``verl.single_controller.placement``) that up to ``max_colocate`` groups share, rank ``r`` of
each in bundle ``r`` (so an actor group and a critic group colocate rank by rank, on the same GPU).
``RayClassWithInitArgs`` says what to build; ``RayWorkerGroup`` starts the actors, gives each its
``torch.distributed`` coordinates (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` per node, and
the rendezvous that rank 0 reports from its own node), and binds every ``@register``'ed method of the class as a
method of the group that dispatches, runs and collects (see ``verl.single_controller.decorator``).

A worker's exception is re-raised on the driver as the same type with the same message, so callers can ``except``
the project's own errors. A worker whose process is gone (killed, crashed, its node lost) is reported as
:class:`WorkerDiedError` naming the group, the rank and the node: the group cannot go on, the caller tears it down
(:meth:`RayWorkerGroup.shutdown`) and may build a new one. Ray itself is initialised by the caller.

Test hook: with ``VERL_TEST_KILL_WORKER=<group>:<rank>:<method>:<call>`` in the driver's environment, the
``<call>``-th call (counted from 1 over the driver process, so a rebuilt group does not repeat it) of ``<method>``
on the group named ``<group>`` SIGKILLs rank ``<rank>`` instead of running the method there, while the other ranks
run it (and wait in its collectives for the dead one). Tests use it to kill a worker mid-step deterministically.
"""

from __future__ import annotations

import functools
import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl.single_controller.decorator import RegisterSpec, get_register_spec, plan_call
from verl.single_controller.placement import PlacementError, RankSlot, release_groups, reserve_nodes
from verl.single_controller.transport import pack, unpack
from verl.single_controller.worker import COLLECTIVE_TIMEOUT_ENV, Worker

logger = logging.getLogger(__name__)

# After one rank fails, how long to wait for the others: they may be stuck in a collective with the failed rank.
ERROR_GRACE_S = 10.0
# After one rank died, how long to wait for the others to be reported: a lost node takes all of its ranks at once,
# and the lowest dead rank is reported. The living ones need not finish: the group is torn down anyway.
DEATH_GRACE_S = 2.0
# How long to wait for the cluster to place a pool's reservations once it has the capacity.
DEFAULT_PLACEMENT_TIMEOUT_S = 120.0
KILL_HOOK_ENV = "VERL_TEST_KILL_WORKER"

__all__ = [
    "DEFAULT_PLACEMENT_TIMEOUT_S",
    "PendingResult",
    "PlacementError",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "WorkerDiedError",
    "get_all",
]


class WorkerDiedError(RuntimeError):
    """A rank's process is gone (killed, crashed, or its node lost); its group cannot go on and must be rebuilt.

    Attributes:
        role: the group's name prefix (``actor_rollout_ref``, ``critic``, ...).
        rank: the dead rank (the lowest one when several died together).
        node_id: the Ray node id the rank ran on.
        node_ip: that node's IP.
        reason: Ray's account of the death.
    """

    def __init__(self, role: str, rank: int, node_id: str, node_ip: str, reason: str) -> None:
        self.role, self.rank, self.node_id, self.node_ip, self.reason = role, rank, node_id, node_ip, reason
        super().__init__(f"worker {role} rank {rank} on node {node_id} ({node_ip}) died: {reason}")

    def __reduce__(self):
        return type(self), (self.role, self.rank, self.node_id, self.node_ip, self.reason)


def _death_reason(err: RayActorError) -> str:
    """Ray's account of a death in one line: without the actor's id fields (the rank and node say more), the
    opening sentence every death repeats, and the list of common causes."""
    lines = [line.strip() for line in str(err).splitlines()]
    fields = ("class_name:", "actor_id:", "pid:", "name:", "namespace:", "ip:")
    text = " ".join(line for line in lines if line and not line.startswith(fields))
    text = text.replace(ActorDiedError.BASE_ERROR_MSG, "").split(" Some common causes")[0].strip()
    return text or type(err).__name__


class RayResourcePool:
    """How many workers a group has, on how many nodes, and what each one reserves.

    The pool reserves ``num_workers / nnodes`` bundles on each of ``nnodes`` distinct nodes when the first group
    starts on it, and frees them when the last group using it shuts down. Each bundle holds rank ``r`` of up to
    ``max_colocate`` groups: ``max_colocate x num_cpus_per_worker`` CPUs and ``max_colocate x num_gpus_per_worker``
    GPUs (give each of 2 colocated groups ``num_gpus_per_worker=0.5`` to share one GPU per rank).

    Args:
        num_workers: number of ranks (the group's world size); a multiple of ``nnodes``.
        num_cpus_per_worker: CPUs each worker takes; fractions are allowed (small CPU boxes).
        num_gpus_per_worker: GPUs each worker takes; Ray sets each worker's ``CUDA_VISIBLE_DEVICES`` to its share.
        nnodes: number of distinct nodes, with the same number of ranks on each.
        max_colocate: how many groups share the pool's bundles (rank by rank).
        placement_timeout_s: how long to wait for the cluster to place the reservations once it has the capacity.

    Raises:
        ValueError: for a non-positive count or share, or ranks that do not split evenly over the nodes.
    """

    def __init__(
        self,
        num_workers: int,
        num_cpus_per_worker: float = 1,
        num_gpus_per_worker: float = 0,
        nnodes: int = 1,
        max_colocate: int = 1,
        placement_timeout_s: float = DEFAULT_PLACEMENT_TIMEOUT_S,
    ) -> None:
        for name, value in (("num_workers", num_workers), ("nnodes", nnodes), ("max_colocate", max_colocate)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        if num_workers % nnodes:
            raise ValueError(
                f"num_workers={num_workers} ranks do not split evenly over nnodes={nnodes} nodes; every node gets "
                "the same number of ranks, so make num_workers a multiple of nnodes."
            )
        if not num_cpus_per_worker > 0:
            raise ValueError(
                f"num_cpus_per_worker must be > 0 (fractions such as 0.5 are fine), got {num_cpus_per_worker!r}."
            )
        if not num_gpus_per_worker >= 0:
            raise ValueError(f"num_gpus_per_worker must be >= 0, got {num_gpus_per_worker!r}.")
        if not placement_timeout_s > 0:
            raise ValueError(f"placement_timeout_s must be > 0 seconds, got {placement_timeout_s!r}.")
        self.num_workers = num_workers
        self.num_cpus_per_worker = num_cpus_per_worker
        self.num_gpus_per_worker = num_gpus_per_worker
        self.nnodes = nnodes
        self.max_colocate = max_colocate
        self.placement_timeout_s = placement_timeout_s
        self._groups: list = []
        self._slots: list[RankSlot] = []
        self._users = 0

    @property
    def world_size(self) -> int:
        return self.num_workers

    @property
    def workers_per_node(self) -> int:
        return self.num_workers // self.nnodes

    @property
    def uses_gpus(self) -> bool:
        return self.num_gpus_per_worker > 0

    def bundle(self) -> dict[str, float]:
        """What one rank's bundle reserves: the share of every group that may colocate there."""
        bundle = {"CPU": self.num_cpus_per_worker * self.max_colocate}
        if self.uses_gpus:
            bundle["GPU"] = self.num_gpus_per_worker * self.max_colocate
        return bundle

    def acquire(self, name: str = "") -> list[RankSlot]:
        """The rank slots, reserving them for the first group; one more group now uses the pool.

        Raises:
            ValueError: more groups than ``max_colocate`` would share the bundles (their actors could never start).
            PlacementError: the cluster cannot hold the reservation (see ``placement.reserve_nodes``).
        """
        if self._users >= self.max_colocate:
            raise ValueError(
                f"{self._users + 1} groups would share a resource pool made for max_colocate={self.max_colocate}; "
                "raise max_colocate or give the group its own pool."
            )
        if not self._slots:
            self._groups, self._slots = reserve_nodes(
                self.nnodes, self.workers_per_node, self.bundle(), self.placement_timeout_s, name
            )
        self._users += 1
        return list(self._slots)

    def release(self) -> None:
        """One group is done with the pool; the last one frees the reservations."""
        self._users = max(0, self._users - 1)
        if self._users == 0 and self._groups:
            release_groups(self._groups)
            self._groups, self._slots = [], []


class RayClassWithInitArgs:
    """A worker class together with the arguments its constructor gets on every rank."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        if not isinstance(cls, type):
            raise ValueError(f"RayClassWithInitArgs needs a plain Python class (not a Ray actor class), got {cls!r}.")
        self.cls = cls
        self.args = args
        self.kwargs = kwargs


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
    ) -> None:
        self._refs, self._ranks, self._collect, self._on_death = refs, ranks, collect, on_death
        self._on_timing = on_timing
        self._start = time.perf_counter() if start is None else start  # perf_counter() when the call began

    def get(self) -> Any:
        timed = get_all(self._refs, self._ranks, self._on_death)
        result = self._collect([unpack(output) for output, _ in timed])
        if self._on_timing is not None:
            self._on_timing(CallTiming(time.perf_counter() - self._start, max(seconds for _, seconds in timed)))
        return result


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
    refs: list, ranks: list[int], on_death: Callable[[int, RayActorError], BaseException] | None = None
) -> list:
    """``ray.get`` every ref; on failure, re-raise the most telling error.

    A dead rank (its process gone) outranks every other failure, since the others' errors (a collective that lost
    its peer) follow from it: the lowest dead rank is raised, as ``on_death(rank, err)`` builds it (Ray's own
    error without it). Otherwise the lowest failed rank's exception is re-raised as its own type; ranks that raise
    the same type and message are folded into it, other failures are logged. Once a rank failed, the others get
    ``ERROR_GRACE_S`` seconds to finish (``DEATH_GRACE_S`` once one died).

    Raises:
        BaseException: the dead rank's error, or the worker's exception (same type and message) with
            ``remote_traceback`` and ``rank``.
    """
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
    first_rank = min(errors)
    first = errors[first_rank]
    for rank, err in sorted(errors.items()):
        if rank != first_rank and (type(err), str(err)) != (type(first), str(first)):
            logger.warning("rank %d also failed: %s: %s", rank, type(err).__name__, err)
    raise first.with_traceback(None)


# (group, method) -> calls so far in this driver process; the kill hook fires once, at the configured call
_kill_hook_calls: Counter = Counter()


def _kill_hook_victim(group_name: str, method_name: str) -> int | None:
    """The rank that the ``VERL_TEST_KILL_WORKER`` test hook kills at this call, or None.

    Raises:
        ValueError: the variable is set but not ``<group>:<rank>:<method>:<call>``.
    """
    raw = os.environ.get(KILL_HOOK_ENV)
    if not raw:
        return None
    parts = raw.split(":")
    if len(parts) != 4 or not parts[1].isdigit() or not parts[3].isdigit() or int(parts[3]) < 1:
        raise ValueError(
            f"{KILL_HOOK_ENV}={raw!r} is not <group>:<rank>:<method>:<call>, e.g. actor_rollout_ref:1:update_actor:3 "
            f"(a test hook; unset it for real runs)."
        )
    group, rank, method, call = parts[0], int(parts[1]), parts[2], int(parts[3])
    if (group, method) != (group_name, method_name):
        return None
    _kill_hook_calls[(group, method)] += 1
    return rank if _kill_hook_calls[(group, method)] == call else None


class RayWorkerGroup:
    """``world_size`` Ray actors of one worker class, with the class's ``@register`` methods bound to the group.

    Calling ``group.method(...)`` dispatches the arguments per the method's dispatch mode, runs the method on
    the selected ranks, waits (unless registered with ``blocking=False``; then a :class:`PendingResult` comes
    back) and returns the collected result.

    Args:
        resource_pool: number of workers and nodes, per-worker CPU/GPU shares; groups that share a pool colocate.
        ray_cls_with_init: the worker class (a ``Worker`` subclass) and its constructor arguments.
        name_prefix: prefix of the actor names (``<prefix>_<rank>``), and the role named when a worker dies;
            default: class name plus a random suffix.
        collective_timeout_s: timeout of the workers' ``torch.distributed`` collectives
            (``VERL_COLLECTIVE_TIMEOUT_S``); None keeps the worker's default.

    Raises:
        ValueError: when a registered method name collides with the group's own attributes.
        PlacementError: when the cluster cannot hold the pool's ranks.
        WorkerDiedError: when a worker dies while the group starts.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool,
        ray_cls_with_init: RayClassWithInitArgs,
        name_prefix: str | None = None,
        collective_timeout_s: float | None = None,
    ) -> None:
        if not issubclass(ray_cls_with_init.cls, Worker):
            raise ValueError(
                f"{ray_cls_with_init.cls.__name__} is not a subclass of verl.single_controller.Worker; the group "
                "needs Worker's rank, rendezvous and placement methods on every actor."
            )
        self._pool = resource_pool
        self._cls = ray_cls_with_init.cls
        self.name_prefix = name_prefix or f"{self._cls.__name__}_{uuid.uuid4().hex[:6]}"
        self._collective_timeout_s = collective_timeout_s
        self._holds_pool = False
        self._workers: list = []
        self._placement: list[dict] = []  # per rank: node_id, node_ip, pid, ... as the worker reported them
        self.call_timings: dict[str, list[CallTiming]] = {}  # see pop_call_timings
        specs = self._registered_methods(self._cls)
        try:
            self._start_workers(ray_cls_with_init)
        except BaseException:
            self.shutdown()
            raise
        for method_name, spec in specs.items():
            setattr(self, method_name, self._make_group_method(method_name, spec))

    @staticmethod
    def _registered_methods(cls: type) -> dict[str, RegisterSpec]:
        specs = {}
        for name in dir(cls):
            spec = get_register_spec(getattr(cls, name, None))
            if spec is None or name.startswith("__"):
                continue
            if hasattr(RayWorkerGroup, name):
                raise ValueError(
                    f"{cls.__name__}.{name} is @register'ed, but RayWorkerGroup already has an attribute {name!r}; "
                    "rename the worker method."
                )
            specs[name] = spec
        return specs

    def _start_workers(self, ray_cls_with_init: RayClassWithInitArgs) -> None:
        pool = self._pool
        slots = pool.acquire(self.name_prefix)
        self._holds_pool = True
        # until the workers report where they are, a death is reported at the planned node
        self._placement = [{"node_id": slot.node_id, "node_ip": slot.node_ip} for slot in slots]
        options: dict[str, Any] = {"num_cpus": pool.num_cpus_per_worker}
        if pool.uses_gpus:
            options["num_gpus"] = pool.num_gpus_per_worker
        remote_cls = ray.remote(self._cls)
        for slot in slots:
            env = {
                "RANK": str(slot.rank),
                "WORLD_SIZE": str(pool.num_workers),
                "LOCAL_RANK": str(slot.local_rank),
                "LOCAL_WORLD_SIZE": str(slot.local_world_size),
            }
            if self._collective_timeout_s is not None:
                env[COLLECTIVE_TIMEOUT_ENV] = str(self._collective_timeout_s)
            rank_options = dict(
                options,
                name=f"{self.name_prefix}_{slot.rank}",
                runtime_env={"env_vars": env},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    slot.placement_group, placement_group_bundle_index=slot.bundle_index
                ),
            )
            actor = remote_cls.options(**rank_options).remote(*ray_cls_with_init.args, **ray_cls_with_init.kwargs)
            self._workers.append(actor)
        ranks = list(range(len(self._workers)))
        # Surface constructor failures here rather than at the first method call.
        self._get([worker.__ray_ready__.remote() for worker in self._workers], ranks)
        # Rank 0 names the rendezvous from its own node; every rank has it before any registered method runs.
        addr, port = self._get([self._workers[0].claim_rendezvous.remote()], [0])[0]
        self._get([worker.set_rendezvous.remote(addr, port) for worker in self._workers[1:]], ranks[1:])
        self._placement = self._get([worker.placement_info.remote() for worker in self._workers], ranks)
        for slot, info in zip(slots, self._placement):
            if info["node_id"] != slot.node_id:  # Ray broke the placement group's promise: local ranks are wrong
                raise PlacementError(
                    f"{self.name_prefix} rank {slot.rank} runs on node {info['node_id']}, not on its reserved node "
                    f"{slot.node_id}."
                )
        logger.info("%s: %s", self.name_prefix, self.describe_placement())

    def describe_placement(self) -> str:
        """One line: each rank's node, local rank and visible devices, and the rendezvous address."""
        ranks = "; ".join(
            f"rank {info['rank']} on node {info['node_id']} ({info['node_ip']}) local "
            f"{info['local_rank']}/{info['local_world_size']} pid {info['pid']} "
            f"CUDA_VISIBLE_DEVICES={info['cuda_visible_devices']} rendezvous {info['master']}"
            for info in self._placement
        )
        nodes = len({info["node_id"] for info in self._placement})
        return f"{len(self._placement)} rank(s) on {nodes} node(s): {ranks}"

    @property
    def placement(self) -> list[dict]:
        """Per rank, where it runs as the worker reported it (``node_id``, ``node_ip``, ``pid``, ``master``, ...)."""
        return [dict(info) for info in self._placement]

    def _death(self, rank: int, err: RayActorError) -> WorkerDiedError:
        info = self._placement[rank] if rank < len(self._placement) else {}
        return WorkerDiedError(
            self.name_prefix, rank, info.get("node_id", "?"), info.get("node_ip", "?"), _death_reason(err)
        )

    def _get(self, refs: list, ranks: list[int]) -> list:
        return get_all(refs, ranks, self._death)

    def _make_group_method(self, method_name: str, spec: RegisterSpec) -> Callable[..., Any]:
        @functools.wraps(getattr(self._cls, method_name))
        def group_method(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            plan = plan_call(spec, self.world_size, args, kwargs)
            victim = _kill_hook_victim(self.name_prefix, method_name)
            refs = []
            for rank, rank_args, rank_kwargs in zip(plan.ranks, plan.args, plan.kwargs, strict=True):
                if rank == victim:
                    logger.warning(
                        "test hook %s: killing %s rank %d at %s", KILL_HOOK_ENV, self.name_prefix, rank, method_name
                    )
                    self._workers[rank].die_now.remote()  # runs first: the method below meets a dead actor
                packed_args = [pack(value) for value in rank_args]
                packed_kwargs = {key: pack(value) for key, value in rank_kwargs.items()}
                refs.append(self._workers[rank].run_timed.remote(method_name, *packed_args, **packed_kwargs))
            pending = PendingResult(
                refs, plan.ranks, plan.collect, self._death, self._record_timing(method_name), start=start
            )
            return pending.get() if spec.blocking else pending

        return group_method

    def _record_timing(self, method_name: str) -> Callable[[CallTiming], None]:
        def record(timing: CallTiming) -> None:
            self.call_timings.setdefault(method_name, []).append(timing)

        return record

    def pop_call_timings(self) -> dict[str, list[CallTiming]]:
        """The timings of the group calls made since the last pop, by method name, in call order."""
        timings, self.call_timings = self.call_timings, {}
        return timings

    @property
    def world_size(self) -> int:
        return self._pool.num_workers

    @property
    def workers(self) -> list:
        """The Ray actor handles, indexed by rank."""
        return list(self._workers)

    def execute_all(self, method_name: str, *args: Any, **kwargs: Any) -> list:
        """Run ``method_name`` with the same arguments on every rank; returns the per-rank results in rank order.

        Raises:
            ValueError: when the worker class has no method of that name.
            WorkerDiedError: when a rank died.
        """
        if not callable(getattr(self._cls, method_name, None)):
            raise ValueError(f"{self._cls.__name__} has no method {method_name!r}; check the name.")
        refs = [getattr(worker, method_name).remote(*args, **kwargs) for worker in self._workers]
        return self._get(refs, list(range(len(refs))))

    def shutdown(self) -> None:
        """Kill every actor of the group (stuck in a collective or not) and release its share of the pool; safe
        to call twice, and after a worker died."""
        for worker in self._workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception as err:  # already gone with its node: nothing left to kill
                logger.debug("could not kill a worker of %s: %s", self.name_prefix, err)
        self._workers = []
        if self._holds_pool:
            self._holds_pool = False
            self._pool.release()
