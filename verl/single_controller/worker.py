"""The ``Worker`` base class: one rank of a worker group, with its place in ``torch.distributed``.

The worker group starts each worker as a separate process (a Ray actor) with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (counted on the worker's own node) in its environment; ``Worker.__init__``
reads them, so a subclass only calls ``super().__init__()``. The rendezvous address is not known when the processes
start: the group asks rank 0 for the IP of its node and a port free there (:meth:`Worker.claim_rendezvous`) and
hands that address to every rank (:meth:`Worker.set_rendezvous`) before any registered method runs. Constructed
outside a group (in a unit test, in a script), a worker is rank 0 of a world of 1 and reads ``MASTER_ADDR`` and
``MASTER_PORT`` from its environment. ``init_torch_distributed`` joins the process group (gloo on CPU, NCCL on
CUDA) with a timeout on every collective, so a rank whose peer died fails within that time instead of waiting
forever.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import socket
import time

import torch
import torch.distributed as dist

from verl.single_controller.decorator import Dispatch, register
from verl.single_controller.transport import pack, unpack

logger = logging.getLogger(__name__)

DEFAULT_MASTER_ADDR = "127.0.0.1"
# How long a collective waits for the other ranks when the group did not say (VERL_COLLECTIVE_TIMEOUT_S): long
# enough for a slow step, short enough that a rank stuck with a dead peer fails in bounded time.
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
COLLECTIVE_TIMEOUT_ENV = "VERL_COLLECTIVE_TIMEOUT_S"
# What torch.distributed says when a collective waited past its timeout: gloo's error in the waiting rank, and the
# NCCL watchdog's (raised in the waiting rank under TORCH_NCCL_BLOCKING_WAIT=1; otherwise the watchdog ends the
# rank's process, which arrives as a death instead).
_COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting \d+ ?ms for|Watchdog caught collective operation timeout")


def find_free_port(host: str = DEFAULT_MASTER_ADDR) -> int:
    """A TCP port on ``host`` that was free a moment ago (the OS picks it; it is released before returning).

    ``host=""`` checks every interface of this machine at once.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _env_number(name: str, default, parse, valid, requirement: str, hint: str):
    """The environment variable ``name`` parsed with ``parse``, ``default`` when unset or empty.

    Raises:
        ValueError: the value does not parse or fails ``valid``; the message names the variable, what it must be
            (``requirement``) and who sets it (``hint``).
    """
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise ValueError(f"Environment variable {name}={raw!r} is not {requirement}; {hint}")
    return value


def _env_int(name: str, default: int, minimum: int) -> int:
    return _env_number(
        name,
        default,
        int,
        lambda value: value >= minimum,
        f"an integer >= {minimum}",
        f"the worker group sets it; when starting a worker by hand, set {name} to a valid value or leave it unset.",
    )


def is_collective_timeout(err: BaseException) -> bool:
    """Whether a worker's error is a ``torch.distributed`` collective that waited past its timeout."""
    return isinstance(err, RuntimeError) and bool(_COLLECTIVE_TIMEOUT.search(str(err)))


def collective_timeout_s() -> float:
    """The collective timeout from ``VERL_COLLECTIVE_TIMEOUT_S``, or :data:`DEFAULT_COLLECTIVE_TIMEOUT_S`.

    Raises:
        ValueError: when the variable is set but not a number > 0.
    """
    return _env_number(
        COLLECTIVE_TIMEOUT_ENV,
        DEFAULT_COLLECTIVE_TIMEOUT_S,
        float,
        lambda value: value > 0,  # NaN fails too
        "a number of seconds > 0",
        "the worker group sets it from its collective_timeout_s argument.",
    )


class Worker:
    """Base class of everything a worker group runs; subclasses add methods marked with ``@register``.

    Attributes exposed as read-only properties: ``rank``, ``world_size``, ``local_rank``, ``local_world_size``
    (ranks of this group on this node), ``master_addr``, ``master_port`` (None when not set and not yet needed).

    Raises:
        ValueError: when the environment variables are malformed, ``RANK >= WORLD_SIZE`` or
            ``LOCAL_RANK >= LOCAL_WORLD_SIZE``.
    """

    def __init__(self) -> None:
        self._world_size = _env_int("WORLD_SIZE", default=1, minimum=1)
        self._rank = _env_int("RANK", default=0, minimum=0)
        self._local_rank = _env_int("LOCAL_RANK", default=self._rank, minimum=0)
        self._local_world_size = _env_int("LOCAL_WORLD_SIZE", default=self._world_size, minimum=1)
        if self._rank >= self._world_size:
            raise ValueError(
                f"RANK={self._rank} is not below WORLD_SIZE={self._world_size}; ranks run from 0 to WORLD_SIZE - 1."
            )
        if self._local_rank >= self._local_world_size:
            raise ValueError(
                f"LOCAL_RANK={self._local_rank} is not below LOCAL_WORLD_SIZE={self._local_world_size}; local ranks "
                "count the ranks on one node from 0."
            )
        self._master_addr = os.environ.get("MASTER_ADDR") or DEFAULT_MASTER_ADDR
        port = _env_int("MASTER_PORT", default=0, minimum=0)
        self._master_port = port or None

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def local_world_size(self) -> int:
        return self._local_world_size

    @property
    def master_addr(self) -> str:
        return self._master_addr

    @property
    def master_port(self) -> int | None:
        return self._master_port

    # -------------------------------------------------------------- called by the worker group, not registered

    def placement_info(self) -> dict:
        """Where this rank runs, as Ray sees it from inside the process: node id and IP, pid, visible devices."""
        import ray

        return {
            "rank": self._rank,
            "local_rank": self._local_rank,
            "local_world_size": self._local_world_size,
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            # what Ray assigned to this actor; the worker never widens it
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "master": f"{self._master_addr}:{self._master_port}",
        }

    def claim_rendezvous(self) -> tuple[str, int]:
        """Rank 0: the IP of this node (as Ray knows it) and a port free on it; becomes this rank's rendezvous.

        Asked inside the worker because only rank 0's own node knows which of its ports are free, and the other
        ranks, on other nodes, must reach it by the address the cluster uses for that node.
        """
        import ray

        addr = ray.util.get_node_ip_address()
        port = find_free_port("")  # free on every interface of this node, whichever one the others come in on
        self.set_rendezvous(addr, port)
        return addr, port

    def set_rendezvous(self, addr: str, port: int) -> None:
        """Use ``addr:port`` (rank 0's) to join ``torch.distributed``; also exported as ``MASTER_ADDR/PORT``."""
        self._master_addr, self._master_port = addr, int(port)
        # libraries that read the environment (env:// init, megatron) see the same address
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)

    def run_timed(self, method_name: str, *args, **kwargs) -> tuple:
        """Run one of this worker's methods; returns ``(its result, the seconds it took in this process)``.

        The worker group calls every registered method through here, so that the driver can tell the time spent
        working from the time spent getting arguments to the worker and the result back. DataProto arguments and
        results travel packed (:mod:`verl.single_controller.transport`); unpacking and packing count as work here.
        """
        start = time.perf_counter()
        args = tuple(unpack(value) for value in args)
        kwargs = {key: unpack(value) for key, value in kwargs.items()}
        result = getattr(self, method_name)(*args, **kwargs)
        return pack(result), time.perf_counter() - start

    # -------------------------------------------------------------- registered

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_torch_distributed(self, backend: str | None = None, timeout_s: float | None = None) -> bool:
        """Join the default ``torch.distributed`` process group of this worker group, once.

        Args:
            backend: ``"gloo"``, ``"nccl"``, or None for NCCL when CUDA is available and gloo otherwise.
            timeout_s: how long a collective waits for the other ranks before it fails; None takes
                ``VERL_COLLECTIVE_TIMEOUT_S`` (set by the worker group) or :data:`DEFAULT_COLLECTIVE_TIMEOUT_S`.
                Gloo raises in the waiting rank; NCCL's watchdog ends the rank's process (the default
                ``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``), which the group then reports as a dead worker.

        Returns:
            True when this call initialised the process group, False when it was already initialised.

        Raises:
            ValueError: for a world of several ranks without ``MASTER_PORT``, NCCL without CUDA, or a bad timeout.
        """
        if dist.is_initialized():
            return False
        timeout_s = collective_timeout_s() if timeout_s is None else timeout_s
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}.")
        use_cuda = torch.cuda.is_available()
        backend = backend or ("nccl" if use_cuda else "gloo")
        if "nccl" in backend and not use_cuda:
            raise ValueError("backend='nccl' needs a CUDA device, but none is visible; use backend='gloo' on CPU.")
        if self._master_port is None:
            if self._world_size > 1:
                raise ValueError(
                    f"MASTER_PORT is not set for a world of {self._world_size} ranks; every rank needs the same "
                    "port. Start workers through RayWorkerGroup, or set MASTER_ADDR and MASTER_PORT."
                )
            # A world of one rendezvouses with itself, so any free port will do.
            self._master_port = find_free_port(self._master_addr)
        if "nccl" in backend:
            # Ray narrows CUDA_VISIBLE_DEVICES to the actor's GPUs (usually one: index 0); a worker started by hand
            # sees every GPU of its node and takes the one of its local rank.
            torch.cuda.set_device(self._local_rank % torch.cuda.device_count())
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{self._master_addr}:{self._master_port}",
            rank=self._rank,
            world_size=self._world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        logger.info(
            "rank %d/%d (local %d/%d) joined torch.distributed (%s) at %s:%s, collective timeout %.0f s",
            self._rank,
            self._world_size,
            self._local_rank,
            self._local_world_size,
            backend,
            self._master_addr,
            self._master_port,
            timeout_s,
        )
        return True
