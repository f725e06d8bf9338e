"""Ray-backed worker groups: N actors of one ``Worker`` subclass driven from the single controller.

``RayResourcePool`` says how many workers and what each one needs; ``RayClassWithInitArgs`` says what to build;
``RayWorkerGroup`` starts the actors (in a placement group when GPUs are requested, as plain CPU actors
otherwise), gives each its ``torch.distributed`` coordinates through environment variables, and binds every
``@register``'ed method of the class as a method of the group that dispatches, runs and collects (see
``verl.single_controller.decorator``). A worker's exception is re-raised on the driver as the same type with
the same message, so callers can ``except`` the project's own errors. Ray itself is initialised by the caller.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl.single_controller.decorator import RegisterSpec, get_register_spec, plan_call
from verl.single_controller.worker import DEFAULT_MASTER_ADDR, find_free_port

logger = logging.getLogger(__name__)

# After one rank fails, how long to wait for the others: they may be stuck in a collective with the failed rank.
ERROR_GRACE_S = 10.0


class RayResourcePool:
    """How many workers a group has and what each one reserves.

    Args:
        num_workers: number of ranks (the group's world size).
        num_cpus_per_worker: CPUs reserved per worker; fractions are allowed (small CPU boxes).
        num_gpus_per_worker: GPUs per worker; above zero, the workers are placed through a placement group.

    Raises:
        ValueError: for a non-positive worker count or CPU share, or a negative GPU count.
    """

    def __init__(self, num_workers: int, num_cpus_per_worker: float = 1, num_gpus_per_worker: float = 0) -> None:
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
            raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}.")
        if not num_cpus_per_worker > 0:
            raise ValueError(
                f"num_cpus_per_worker must be > 0 (fractions such as 0.5 are fine), got {num_cpus_per_worker!r}."
            )
        if not num_gpus_per_worker >= 0:
            raise ValueError(f"num_gpus_per_worker must be >= 0, got {num_gpus_per_worker!r}.")
        self.num_workers = num_workers
        self.num_cpus_per_worker = num_cpus_per_worker
        self.num_gpus_per_worker = num_gpus_per_worker

    @property
    def world_size(self) -> int:
        return self.num_workers

    @property
    def uses_gpus(self) -> bool:
        return self.num_gpus_per_worker > 0


class RayClassWithInitArgs:
    """A worker class together with the arguments its constructor gets on every rank."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        if not isinstance(cls, type):
            raise ValueError(f"RayClassWithInitArgs needs a plain Python class (not a Ray actor class), got {cls!r}.")
        self.cls = cls
        self.args = args
        self.kwargs = kwargs


class PendingResult:
    """The result of a non-blocking group call; ``get()`` waits for every rank and collects."""

    def __init__(self, refs: list, ranks: list[int], collect: Callable[[list], Any]) -> None:
        self._refs, self._ranks, self._collect = refs, ranks, collect

    def get(self) -> Any:
        return self._collect(get_all(self._refs, self._ranks))


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


def get_all(refs: list, ranks: list[int]) -> list:
    """``ray.get`` every ref; on failure, re-raise the lowest failed rank's exception as its own type.

    Ranks that raise an error with the same type and message as the reported one are folded into it; other
    failures are logged. Once a rank failed, the others get ``ERROR_GRACE_S`` seconds to finish.

    Raises:
        BaseException: the worker's exception (same type and message), with ``remote_traceback`` and ``rank``.
    """
    index_of = {ref: i for i, ref in enumerate(refs)}
    outputs: list[Any] = [None] * len(refs)
    errors: dict[int, BaseException] = {}
    pending, deadline = list(refs), None
    while pending:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
        if not ready:
            logger.warning("%d rank(s) had not finished %.0f s after another rank failed", len(pending), ERROR_GRACE_S)
            break
        i = index_of[ready[0]]
        try:
            outputs[i] = ray.get(ready[0])
        except RayTaskError as err:
            errors[ranks[i]] = _unwrap_task_error(err, ranks[i])
            deadline = deadline or time.monotonic() + ERROR_GRACE_S
    if not errors:
        return outputs
    first_rank = min(errors)
    first = errors[first_rank]
    for rank, err in sorted(errors.items()):
        if rank != first_rank and (type(err), str(err)) != (type(first), str(first)):
            logger.warning("rank %d also failed: %s: %s", rank, type(err).__name__, err)
    raise first.with_traceback(None)


class RayWorkerGroup:
    """``world_size`` Ray actors of one worker class, with the class's ``@register`` methods bound to the group.

    Calling ``group.method(...)`` dispatches the arguments per the method's dispatch mode, runs the method on
    the selected ranks, waits (unless registered with ``blocking=False``; then a :class:`PendingResult` comes
    back) and returns the collected result.

    Args:
        resource_pool: number of workers and per-worker CPU/GPU shares.
        ray_cls_with_init: the worker class (a ``Worker`` subclass) and its constructor arguments.
        name_prefix: prefix of the actor names (``<prefix>_<rank>``); default: class name plus a random suffix.

    Raises:
        ValueError: when a registered method name collides with the group's own attributes.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool,
        ray_cls_with_init: RayClassWithInitArgs,
        name_prefix: str | None = None,
    ) -> None:
        self._pool = resource_pool
        self._cls = ray_cls_with_init.cls
        self.name_prefix = name_prefix or f"{self._cls.__name__}_{uuid.uuid4().hex[:6]}"
        self._placement_group = None
        self._workers: list = []
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
        master_port = find_free_port(DEFAULT_MASTER_ADDR)
        options: dict[str, Any] = {"num_cpus": pool.num_cpus_per_worker}
        if pool.uses_gpus:
            bundle = {"CPU": pool.num_cpus_per_worker, "GPU": pool.num_gpus_per_worker}
            self._placement_group = placement_group([bundle] * pool.num_workers, strategy="PACK")
            ray.get(self._placement_group.ready())
            options["num_gpus"] = pool.num_gpus_per_worker
        remote_cls = ray.remote(self._cls)
        for rank in range(pool.num_workers):
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(pool.num_workers),
                "LOCAL_RANK": str(rank),
                "MASTER_ADDR": DEFAULT_MASTER_ADDR,
                "MASTER_PORT": str(master_port),
            }
            rank_options = dict(options, name=f"{self.name_prefix}_{rank}", runtime_env={"env_vars": env})
            if self._placement_group is not None:
                rank_options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    self._placement_group, placement_group_bundle_index=rank
                )
            actor = remote_cls.options(**rank_options).remote(*ray_cls_with_init.args, **ray_cls_with_init.kwargs)
            self._workers.append(actor)
        # Surface constructor failures here rather than at the first method call.
        ray.get([worker.__ray_ready__.remote() for worker in self._workers])

    def _make_group_method(self, method_name: str, spec: RegisterSpec) -> Callable[..., Any]:
        @functools.wraps(getattr(self._cls, method_name))
        def group_method(*args: Any, **kwargs: Any) -> Any:
            plan = plan_call(spec, self.world_size, args, kwargs)
            refs = [
                getattr(self._workers[rank], method_name).remote(*rank_args, **rank_kwargs)
                for rank, rank_args, rank_kwargs in zip(plan.ranks, plan.args, plan.kwargs, strict=True)
            ]
            pending = PendingResult(refs, plan.ranks, plan.collect)
            return pending.get() if spec.blocking else pending

        return group_method

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
        """
        if not callable(getattr(self._cls, method_name, None)):
            raise ValueError(f"{self._cls.__name__} has no method {method_name!r}; check the name.")
        refs = [getattr(worker, method_name).remote(*args, **kwargs) for worker in self._workers]
        return get_all(refs, list(range(len(refs))))

    def shutdown(self) -> None:
        """Kill every actor of the group and release its placement group; safe to call twice."""
        for worker in self._workers:
            ray.kill(worker, no_restart=True)
        self._workers = []
        if self._placement_group is not None:
            remove_placement_group(self._placement_group)
            self._placement_group = None
