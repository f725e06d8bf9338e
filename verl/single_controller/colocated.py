"""Several roles' workers in one process per rank: verl's colocated worker class.

Roles that share a resource pool (the actor with its rollout and reference, the critic, the reward model) need not
each pay for a process of their own: one interpreter, one import of torch and transformers, one CUDA context and one
caching allocator, so memory one role's offload frees is memory the next role can use.
:func:`create_colocated_worker_cls` builds a :class:`ColocatedWorker` subclass that hosts one worker object per role
and exposes each role's ``@register``'ed methods under the name ``<role>__<method>``, with the role's own
dispatch spec; a worker group of that class (:meth:`~verl.single_controller.ray_worker_group.RayWorkerGroup.spawn`)
hands out one group per role that looks and dispatches like a group of the role's class alone.

What a process holds once for all its roles, and how each role still sees its own:

- the random state (torch's CPU and CUDA generators, Python's ``random``, NumPy's global one): each role gets a
  copy of the state the process started with, and its calls run on its own state, swapped in and out around every
  call (except a method on a thread of its own, a Ray concurrency group, which must draw none); a role therefore
  draws the same numbers as it would in a process of its own, and saves and restores its own state in
  checkpoints;
- the default ``torch.distributed`` group, megatron-core's parallel state, the profiler and the environment: shared,
  so the roles that may share them are decided before the workers start (``verl.workers.config.colocation``), and
  the others get processes of their own;
- the rendezvous: the process's one address, handed to every role.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from verl.single_controller.decorator import REGISTER_ATTR, registered_methods
from verl.single_controller.worker import Worker

#: what separates a role's name from its method's in the colocated class (``critic__compute_values``)
ROLE_METHOD_SEPARATOR = "__"


def role_method_name(role: str, method_name: str) -> str:
    """The colocated class's name of ``role``'s method ``method_name``."""
    return f"{role}{ROLE_METHOD_SEPARATOR}{method_name}"


class RandomState:
    """The process-wide random generators' state: torch's CPU (and CUDA's once initialised), ``random``, NumPy."""

    def __init__(self) -> None:
        self.torch = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.python = random.getstate()
        self.numpy = np.random.get_state()

    def restore(self) -> None:
        torch.set_rng_state(self.torch)
        if self.cuda is not None and torch.cuda.is_initialized():
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        np.random.set_state(self.numpy)


class ColocatedWorker(Worker):
    """One rank of several roles: a worker object per role, each called on its own random state.

    Args:
        roles: per role name, ``(worker class, constructor keyword arguments)``, in the order they are built; every
            class is a :class:`Worker` subclass, and all of them read this process's ``RANK`` / ``WORLD_SIZE``.
    """

    def __init__(self, roles: dict[str, tuple[type, dict[str, Any]]]) -> None:
        super().__init__()
        fresh = RandomState()  # what a process of its own would start from
        self._random_states: dict[str, RandomState] = {}
        self._roles: dict[str, Worker] = {}
        for role, (cls, kwargs) in roles.items():
            self._random_states[role] = fresh
            with self._as_role(role):
                self._roles[role] = cls(**kwargs)

    @property
    def roles(self) -> dict[str, Worker]:
        """The hosted workers by role name, in build order."""
        return dict(self._roles)

    @contextlib.contextmanager
    def _as_role(self, role: str) -> Iterator[None]:
        """Run the block on ``role``'s random state, and keep the state the block leaves for its next call."""
        outside = RandomState()
        self._random_states[role].restore()
        try:
            yield
        finally:
            self._random_states[role] = RandomState()
            outside.restore()

    def call_role(self, role: str, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """``role``'s worker's ``method_name`` (registered or not) with these arguments, on the role's random state.

        Raises:
            ValueError: this process hosts no such role.
        """
        if role not in self._roles:
            raise ValueError(f"this process hosts the roles {sorted(self._roles)}, not {role!r}")
        with self._as_role(role):
            return getattr(self._roles[role], method_name)(*args, **kwargs)

    def set_rendezvous(self, addr: str, port: int) -> None:
        """The process's rendezvous, for every hosted role too (each joins ``torch.distributed`` by it)."""
        super().set_rendezvous(addr, port)
        for worker in self._roles.values():
            worker.set_rendezvous(addr, port)


def _role_method(role: str, method_name: str, spec) -> Any:
    if spec.concurrency_group is None:

        def method(self: ColocatedWorker, *args: Any, **kwargs: Any) -> Any:
            return self.call_role(role, method_name, *args, **kwargs)

    else:  # runs on a thread of its own beside the role's other calls: swapping the process's random state there
        # would pull it from under a call in progress (such methods take weights in; they draw no random numbers)

        def method(self: ColocatedWorker, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.roles[role], method_name)(*args, **kwargs)

    method.__name__ = role_method_name(role, method_name)
    method.__qualname__ = method.__name__
    setattr(method, REGISTER_ATTR, spec)
    return method


def create_colocated_worker_cls(roles: dict[str, type], base: type = ColocatedWorker) -> type:
    """A subclass of ``base`` (a :class:`ColocatedWorker`) hosting ``roles`` (role name -> worker class): every
    registered method of each role's class becomes ``<role>__<method>``, registered with the role's spec, so that a
    worker group of the new class dispatches each as the role's own group would (Ray's concurrency groups included).

    Raises:
        ValueError: no roles, a role name with the separator in it, a class that is not a :class:`Worker`, or
            ``base`` that is not a :class:`ColocatedWorker`.
    """
    if not roles:
        raise ValueError("a colocated worker needs at least one role")
    if not issubclass(base, ColocatedWorker):
        raise ValueError(f"{base.__name__} is not a ColocatedWorker subclass")
    namespace: dict[str, Any] = {}
    for role, cls in roles.items():
        if ROLE_METHOD_SEPARATOR in role or not role:
            raise ValueError(f"role name {role!r} is empty or contains {ROLE_METHOD_SEPARATOR!r}")
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise ValueError(f"role {role!r}: {cls!r} is not a subclass of verl.single_controller.Worker")
        for method_name, spec in registered_methods(cls).items():
            namespace[role_method_name(role, method_name)] = _role_method(role, method_name, spec)
    name = "Colocated_" + "_".join(cls.__name__ for cls in roles.values())
    namespace["ROLE_CLASSES"] = dict(roles)
    namespace["__doc__"] = f"{', '.join(roles)} in one process per rank (see verl.single_controller.colocated)."
    return type(name, (base,), namespace)
