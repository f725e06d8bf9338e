"""The ``Worker`` base class: one rank of a worker group, with its place in ``torch.distributed``.

The worker group starts each worker as a separate process (a Ray actor) with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` in its environment; ``Worker.__init__`` reads them, so a
subclass only calls ``super().__init__()``. Constructed outside a group (in a unit test, in a script), a worker
is rank 0 of a world of 1. ``init_torch_distributed`` joins the process group (gloo on CPU, NCCL on CUDA).
"""

from __future__ import annotations

import datetime
import logging
import os
import socket

import torch
import torch.distributed as dist

from verl.single_controller.decorator import Dispatch, register

logger = logging.getLogger(__name__)

DEFAULT_MASTER_ADDR = "127.0.0.1"


def find_free_port(host: str = DEFAULT_MASTER_ADDR) -> int:
    """A TCP port on ``host`` that was free a moment ago (the OS picks it; it is released before returning)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _env_int(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(
            f"Environment variable {name}={raw!r} is not an integer >= {minimum}. The worker group sets it; when "
            f"starting a worker by hand, set {name} to a valid value or leave it unset."
        )
    return value


class Worker:
    """Base class of everything a worker group runs; subclasses add methods marked with ``@register``.

    Attributes exposed as read-only properties: ``rank``, ``world_size``, ``local_rank``, ``master_addr``,
    ``master_port`` (None when not set and not yet needed).

    Raises:
        ValueError: when the environment variables are malformed or ``RANK >= WORLD_SIZE``.
    """

    def __init__(self) -> None:
        self._world_size = _env_int("WORLD_SIZE", default=1, minimum=1)
        self._rank = _env_int("RANK", default=0, minimum=0)
        self._local_rank = _env_int("LOCAL_RANK", default=self._rank, minimum=0)
        if self._rank >= self._world_size:
            raise ValueError(
                f"RANK={self._rank} is not below WORLD_SIZE={self._world_size}; ranks run from 0 to WORLD_SIZE - 1."
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
    def master_addr(self) -> str:
        return self._master_addr

    @property
    def master_port(self) -> int | None:
        return self._master_port

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_torch_distributed(self, backend: str | None = None, timeout_s: float = 1800.0) -> bool:
        """Join the default ``torch.distributed`` process group of this worker group, once.

        Args:
            backend: ``"gloo"``, ``"nccl"``, or None for NCCL when CUDA is available and gloo otherwise.
            timeout_s: how long collectives wait for the other ranks before failing.

        Returns:
            True when this call initialised the process group, False when it was already initialised.

        Raises:
            ValueError: for a world of several ranks without ``MASTER_PORT``, or NCCL without CUDA.
        """
        if dist.is_initialized():
            return False
        use_cuda = torch.cuda.is_available()
        backend = backend or ("nccl" if use_cuda else "gloo")
        if backend == "nccl" and not use_cuda:
            raise ValueError("backend='nccl' needs a CUDA device, but none is visible; use backend='gloo' on CPU.")
        if self._master_port is None:
            if self._world_size > 1:
                raise ValueError(
                    f"MASTER_PORT is not set for a world of {self._world_size} ranks; every rank needs the same "
                    "port. Start workers through RayWorkerGroup, or set MASTER_ADDR and MASTER_PORT."
                )
            # A world of one rendezvouses with itself, so any free port will do.
            self._master_port = find_free_port(self._master_addr)
        if backend == "nccl":
            # Ray narrows CUDA_VISIBLE_DEVICES to the actor's GPUs, so the local rank can exceed the device count.
            torch.cuda.set_device(self._local_rank % torch.cuda.device_count())
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{self._master_addr}:{self._master_port}",
            rank=self._rank,
            world_size=self._world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        logger.info("rank %d/%d joined torch.distributed (%s)", self._rank, self._world_size, backend)
        return True
