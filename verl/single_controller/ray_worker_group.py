"""Ray-backed worker groups: N actors of one ``Worker`` subclass driven from the single controller.

``RayClassWithInitArgs`` says what to build; ``RayWorkerGroup`` starts the actors on the rank slots of a
``RayResourcePool`` (see ``verl.single_controller.placement``: rank ``r`` of every group sharing the pool in bundle
``r``, so an actor group and a critic group colocate rank by rank), gives each its ``torch.distributed``
coordinates (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` per node, and the rendezvous that
rank 0 reports from its own node), and binds every ``@register``'ed method of the class as a method of the group
that dispatches (``verl.single_controller.decorator``), runs and collects (``verl.single_controller.results``: a
worker's exception re-raised as its own type, a dead rank as :class:`WorkerDiedError` naming the group, the rank
and the node, a rank the others timed out waiting for in a collective as :class:`CollectiveTimeoutError`, the
same way), timing each call (``verl.single_controller.timing``). After a death the caller tears the group down
(:meth:`RayWorkerGroup.shutdown`) and may build a new one. Ray itself is initialised by the caller.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl.single_controller.decorator import RegisterSpec, check_data_parallel_layout, plan_call, registered_methods
from verl.single_controller.placement import DEFAULT_PLACEMENT_TIMEOUT_S, PlacementError, RayResourcePool
from verl.single_controller.results import (
    CollectiveTimeoutError,
    GenerationTimeoutError,
    PendingResult,
    WorkerDiedError,
    death_reason,
    get_all,
)
from verl.single_controller.timing import CallTiming, CallTimings
from verl.single_controller.transport import pack
from verl.single_controller.worker import COLLECTIVE_TIMEOUT_ENV, Worker

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_PLACEMENT_TIMEOUT_S",
    "CollectiveTimeoutError",
    "CallTiming",
    "PendingResult",
    "PlacementError",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "WorkerDiedError",
    "get_all",
]


class RayClassWithInitArgs:
    """A worker class together with the arguments its constructor gets on every rank."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        if not isinstance(cls, type):
            raise ValueError(f"RayClassWithInitArgs needs a plain Python class (not a Ray actor class), got {cls!r}.")
        self.cls = cls
        self.args = args
        self.kwargs = kwargs


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
        runtime_env: Ray runtime environment of every worker (e.g. ``{"nsight": {...}}`` to run them under Nsight
            Systems); the group's own ``env_vars`` are added to it.

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
        runtime_env: dict[str, Any] | None = None,
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
        self._runtime_env = dict(runtime_env or {})
        self._holds_pool = False
        self._workers: list = []
        self._placement: list[dict] = []  # per rank: node_id, node_ip, pid, ... as the worker reported them
        self._timings = CallTimings()
        self._data_parallel_layout: list[tuple[int, bool]] | None = None
        self._role: str | None = None  # set on the groups spawn() hands out: the hosted role they call
        self._root: RayWorkerGroup | None = None  # and the group that owns the processes
        specs = self._registered_methods(self._cls)
        self._specs = specs
        try:
            self._start_workers(ray_cls_with_init)
        except BaseException:
            self.shutdown()
            raise
        for method_name, spec in specs.items():
            setattr(self, method_name, self._make_group_method(method_name, spec))

    @staticmethod
    def _registered_methods(cls: type) -> dict[str, RegisterSpec]:
        specs = registered_methods(cls)
        for name in specs:
            if hasattr(RayWorkerGroup, name):
                raise ValueError(
                    f"{cls.__name__}.{name} is @register'ed, but RayWorkerGroup already has an attribute {name!r}; "
                    "rename the worker method."
                )
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
        groups = {spec.concurrency_group: 1 for spec in self._specs.values() if spec.concurrency_group is not None}
        remote_cls = ray.remote(concurrency_groups=groups)(self._cls) if groups else ray.remote(self._cls)
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
                runtime_env={**self._runtime_env, "env_vars": {**self._runtime_env.get("env_vars", {}), **env}},
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

    def spawn(self, prefix_set=None) -> dict[str, RayWorkerGroup]:
        """One group per role of a colocated worker class (:func:`~verl.single_controller.colocated.
        create_colocated_worker_cls`), by role name: each has the role's class's methods under their own names, with
        their own dispatch, data-parallel layout and call timings, and runs them on the role's worker in these
        processes. A death or a hang names this group; shutting any of them down shuts the processes down.

        Args:
            prefix_set: the roles to hand out (verl's argument name); None: every hosted role.

        Raises:
            ValueError: this group's class hosts no roles, or not one of ``prefix_set``.
        """
        role_classes = getattr(self._cls, "ROLE_CLASSES", None)
        if not role_classes:
            raise ValueError(f"{self._cls.__name__} is not a colocated worker class: it has no roles to spawn.")
        wanted = list(role_classes) if prefix_set is None else list(prefix_set)
        unknown = [role for role in wanted if role not in role_classes]
        if unknown:
            raise ValueError(f"{self._cls.__name__} hosts the roles {sorted(role_classes)}, not {sorted(unknown)}.")
        return {role: self._role_group(role, role_classes[role]) for role in wanted}

    def _role_group(self, role: str, cls: type) -> RayWorkerGroup:
        view = object.__new__(RayWorkerGroup)
        shared = ("_pool", "name_prefix", "_collective_timeout_s", "_runtime_env", "_workers", "_placement")
        for name in shared:  # the same list objects: a shutdown of the processes empties them for every role
            setattr(view, name, getattr(self, name))
        view._cls, view._role, view._root, view._holds_pool = cls, role, self, False
        view._timings, view._data_parallel_layout = CallTimings(), None
        view._specs = self._registered_methods(cls)
        for method_name, spec in view._specs.items():
            setattr(view, method_name, view._make_group_method(method_name, spec))
        return view

    @property
    def role(self) -> str | None:
        """The hosted role this group calls (a group from :meth:`spawn`), else None."""
        return self._role

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
            self.name_prefix, rank, info.get("node_id", "?"), info.get("node_ip", "?"), death_reason(err)
        )

    def _hang(
        self, method_name: str, awaited: list[int], timed_out: dict[int, BaseException], still_running: list[int]
    ) -> CollectiveTimeoutError:
        """The error of a collective that timed out in ``method_name``: the lowest rank the others waited for (any
        other such rank named in the reason, with its node), or, when every rank timed out, the lowest of those."""
        waiting = sorted(timed_out)
        first_error = str(timed_out[waiting[0]]).strip().splitlines()[0]
        timeout = "" if self._collective_timeout_s is None else f" of {self._collective_timeout_s:g} s"
        named = (awaited or waiting)[0]
        if awaited:
            state = (
                "it was still running then: it hangs, or is far slower than the others"
                if named in still_running
                else "it had returned without joining that collective"
            )
            reason = (
                f"rank(s) {_ranks_text(waiting)} waited for it in a collective of {method_name} until their "
                f"collective timeout{timeout} ran out ({first_error}); {state}"
            )
            if len(awaited) > 1:
                reason += "; also waited for: " + ", ".join(self._where(rank) for rank in awaited[1:])
        else:
            reason = (
                f"every rank timed out in a collective of {method_name}{timeout} ({first_error}); none was seen to hang"
            )
        info = self._placement[named] if named < len(self._placement) else {}
        return CollectiveTimeoutError(
            self.name_prefix, named, info.get("node_id", "?"), info.get("node_ip", "?"), reason
        )

    def generation_timeout(self, rank: int, timeout_s: float) -> GenerationTimeoutError:
        """The error of rank ``rank`` having returned nothing within ``timeout_s`` seconds, with its node."""
        info = self._placement[rank] if rank < len(self._placement) else {}
        reason = f"no result {timeout_s:g} s after it was awaited (trainer.collective_timeout_s)"
        return GenerationTimeoutError(
            self.name_prefix, rank, info.get("node_id", "?"), info.get("node_ip", "?"), reason
        )

    def _where(self, rank: int) -> str:
        info = self._placement[rank] if rank < len(self._placement) else {}
        return f"rank {rank} on node {info.get('node_id', '?')} ({info.get('node_ip', '?')})"

    def _get(self, refs: list, ranks: list[int], method_name: str = "a call") -> list:
        return get_all(refs, ranks, self._death, functools.partial(self._hang, method_name))

    def _make_group_method(self, method_name: str, spec: RegisterSpec) -> Callable[..., Any]:
        @functools.wraps(getattr(self._cls, method_name))
        def group_method(*args: Any, **kwargs: Any) -> Any:
            pending = self._call(method_name, spec, args, kwargs)
            return pending.get() if spec.blocking else pending

        return group_method

    def _call(self, method_name: str, spec: RegisterSpec, args: tuple, kwargs: dict) -> PendingResult:
        """Split the arguments per the dispatch mode and start ``method_name`` on the selected ranks."""
        start = time.perf_counter()
        plan = plan_call(spec, self.world_size, args, kwargs, self._data_parallel_layout)
        refs = []
        for rank, rank_args, rank_kwargs in zip(plan.ranks, plan.args, plan.kwargs, strict=True):
            packed_args = [pack(value) for value in rank_args]
            packed_kwargs = {key: pack(value) for key, value in rank_kwargs.items()}
            run = self._workers[rank].run_timed
            if spec.concurrency_group is not None:
                run = run.options(concurrency_group=spec.concurrency_group)
            refs.append(run.remote(self._worker_method_name(method_name), *packed_args, **packed_kwargs))
        on_timing = self._timings.recorder(method_name)
        on_hang = functools.partial(self._hang, method_name)
        return PendingResult(refs, plan.ranks, plan.collect, self._death, on_timing, start=start, on_hang=on_hang)

    def _worker_method_name(self, method_name: str) -> str:
        """The name the worker process knows ``method_name`` by (a hosted role's: ``<role>__<method>``)."""
        if self._role is None:
            return method_name
        from verl.single_controller.colocated import role_method_name

        return role_method_name(self._role, method_name)

    def submit(self, method_name: str, *args: Any, **kwargs: Any) -> PendingResult:
        """Start the ``@register``'ed ``method_name`` as ``group.method_name(...)`` would, without waiting: the
        returned :class:`PendingResult`'s ``get()`` waits and collects. Calls to one worker run in the order they
        were made, so a later call waits behind this one.

        Raises:
            ValueError: the worker class has no ``@register``'ed method of that name.
        """
        spec = self._specs.get(method_name)
        if spec is None:
            raise ValueError(f"{self._cls.__name__} has no @register'ed method {method_name!r}; check the name.")
        return self._call(method_name, spec, args, kwargs)

    @property
    def call_timings(self) -> dict[str, list[CallTiming]]:
        """The timings of the group calls made since the last pop, by method name, in call order (not popped)."""
        return self._timings.peek()

    def pop_call_timings(self) -> dict[str, list[CallTiming]]:
        """The timings of the group calls made since the last pop, by method name, in call order."""
        return self._timings.pop()

    @property
    def world_size(self) -> int:
        return self._pool.num_workers

    def set_data_parallel_layout(self, layout: list[tuple[int, bool]] | None) -> None:
        """Per rank, ``(data-parallel rank, collects)``: ranks of one model-parallel group receive the same rows
        and one of them returns the results (see :func:`~verl.single_controller.decorator.plan_call`); None
        makes every rank its own data-parallel rank again.

        Raises:
            ValueError: a layout of the wrong length, or one that breaks the rules of
                :func:`~verl.single_controller.decorator.check_data_parallel_layout`.
        """
        if layout is not None:
            layout = [(int(dp_rank), bool(collects)) for dp_rank, collects in layout]
            if len(layout) != self.world_size:
                raise ValueError(f"data-parallel layout has {len(layout)} entries for {self.world_size} ranks")
            check_data_parallel_layout(layout)
        self._data_parallel_layout = layout

    @property
    def data_parallel_layout(self) -> list[tuple[int, bool]] | None:
        """The layout :meth:`set_data_parallel_layout` set (None: every rank its own data-parallel rank)."""
        return None if self._data_parallel_layout is None else list(self._data_parallel_layout)

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
        if self._role is None:
            refs = [getattr(worker, method_name).remote(*args, **kwargs) for worker in self._workers]
        else:
            refs = [worker.call_role.remote(self._role, method_name, *args, **kwargs) for worker in self._workers]
        return self._get(refs, list(range(len(refs))), method_name)

    def shutdown(self) -> None:
        """Kill every actor of the group (stuck in a collective or not) and release its share of the pool; safe
        to call twice, and after a worker died. A role's group (:meth:`spawn`) shuts its processes down, and so
        every role hosted there."""
        if self._root is not None:
            self._root.shutdown()
            return
        for worker in self._workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception as err:  # already gone with its node: nothing left to kill
                logger.debug("could not kill a worker of %s: %s", self.name_prefix, err)
        self._workers.clear()  # in place: the role groups spawned from this one share the list
        if self._holds_pool:
            self._holds_pool = False
            self._pool.release()


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(str(rank) for rank in ranks)
