"""Offloading a megatron model's parameters, gradients and optimizer state to host memory between phases.

``megatron.param_offload``, ``grad_offload`` and ``optimizer_offload`` (verl's keys): while a worker waits between
calls (the rollout of another role, the reward, the critic's update), its GPU memory holds only what is not
offloaded. The move works on storages, not on tensors: each distinct storage under the chosen tensors (a
parameter, megatron-core DDP's contiguous gradient buffer that every ``main_grad`` is a view of, an Adam moment)
is copied to host memory and its device storage shrunk to zero bytes (the freed blocks are then returned to the
driver, :func:`~verl.utils.device_memory.release_device_memory`); bringing it back regrows the storage and
copies the bytes in. Views, ``.data`` identities and the optimizer's references to its tensors therefore stay
valid, whatever wraps them. On CPU the tensors already live in host memory: :class:`MegatronOffloader` moves
nothing there (``offloaded_bytes`` stays 0), which is what these keys mean on CPU.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from verl.utils.device_memory import release_device_memory

logger = logging.getLogger(__name__)


class StorageOffload:
    """A set of storages moved to host memory and back as one unit.

    Args:
        tensors: the tensors whose storages move (views of one storage count once; empty storages are skipped).
        skip_cpu: leave storages already in host memory alone (True in production; tests turn it off to
            exercise the move on a CPU-only machine).
    """

    def __init__(self, tensors: Iterable[torch.Tensor], *, skip_cpu: bool = True):
        self._storages: dict[int, torch.UntypedStorage] = {}
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.nbytes() == 0 or (skip_cpu and storage.device.type == "cpu"):
                continue
            self._storages.setdefault(storage.data_ptr(), storage)
        self._host: list[torch.Tensor] | None = None

    @property
    def num_bytes(self) -> int:
        """Bytes that move (0 when everything is already in host memory)."""
        if self._host is not None:
            return sum(host.numel() for host in self._host)
        return sum(storage.nbytes() for storage in self._storages.values())

    @property
    def offloaded(self) -> bool:
        return self._host is not None

    def offload(self) -> None:
        """Copy every storage to host memory and free its device bytes (no-op when already offloaded)."""
        if self._host is not None or not self._storages:
            return
        host = []
        for storage in self._storages.values():
            device_bytes = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
            # pinned host memory makes the copy back asynchronous; the copy out is blocking, as the bytes are
            # freed right after it
            copy = torch.empty(device_bytes.numel(), dtype=torch.uint8, pin_memory=storage.device.type == "cuda")
            copy.copy_(device_bytes)
            host.append(copy)
            storage.resize_(0)
        self._host = host

    def onload(self) -> None:
        """Regrow every storage on its device and copy its bytes back (no-op when not offloaded)."""
        if self._host is None:
            return
        for storage, host in zip(self._storages.values(), self._host, strict=True):
            storage.resize_(host.numel())
            torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage).copy_(host, non_blocking=True)
        if any(storage.device.type == "cuda" for storage in self._storages.values()):
            torch.cuda.synchronize()
        self._host = None


def _torch_optimizers(optimizer: Any) -> Iterator[torch.optim.Optimizer]:
    """The torch optimizers inside megatron-core's wrappers (chained, mixed precision) or the adapter's."""
    if optimizer is None:
        return
    if isinstance(optimizer, torch.optim.Optimizer):
        yield optimizer
        return
    for inner in getattr(optimizer, "chained_optimizers", None) or [getattr(optimizer, "optimizer", None)]:
        yield from _torch_optimizers(inner)


def optimizer_tensors(optimizer: Any, exclude: Iterable[torch.Tensor] = ()) -> list[torch.Tensor]:
    """The optimizer's state tensors and the parameters it updates (fp32 main copies), minus ``exclude``'s
    storages (the model's own parameters, which ``param_offload`` moves)."""
    excluded = {tensor.untyped_storage().data_ptr() for tensor in exclude}
    tensors = []
    for torch_optimizer in _torch_optimizers(optimizer):
        for group in torch_optimizer.param_groups:
            tensors.extend(group["params"])
        for state in torch_optimizer.state.values():
            tensors.extend(value for value in state.values() if torch.is_tensor(value) and value.dim() > 0)
    return [tensor for tensor in tensors if tensor.untyped_storage().data_ptr() not in excluded]


def gradient_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Gradients of the model: ``.grad`` and megatron-core DDP's ``main_grad`` (views of its gradient buffer)."""
    tensors = []
    for param in model.parameters():
        for grad in (param.grad, getattr(param, "main_grad", None)):
            if grad is not None:
                tensors.append(grad)
    return tensors


class MegatronOffloader:
    """What a megatron section's offload keys move, and when.

    Parameters are needed by every phase (generation, log-probs, the update); gradients and optimizer state by
    the update only. :meth:`phase` brings back what a phase needs and, after it, moves the selected parts out
    again, so between phases only what is not offloaded stays on the device.

    Args:
        model: the (possibly wrapped) model.
        optimizer: its optimizer, or None (a frozen reference).
        param_offload: move the parameters out between phases.
        grad_offload: move the gradients out between updates.
        optimizer_offload: move the optimizer state out between updates.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Any = None,
        *,
        param_offload: bool,
        grad_offload: bool,
        optimizer_offload: bool,
    ):
        self.model = model
        self.optimizer = optimizer
        self.param_offload = param_offload
        self.grad_offload = grad_offload
        self.optimizer_offload = optimizer_offload
        self._params = StorageOffload(model.parameters()) if param_offload else None
        self._optimizer = (
            StorageOffload(optimizer_tensors(optimizer, exclude=model.parameters()))
            if optimizer_offload and optimizer is not None
            else None
        )
        self._grads: StorageOffload | None = None
        self._skip_cpu = True
        self.offloaded_bytes = 0  # bytes in host memory after the last offload (0 on CPU: nothing moves)

    def force_host_moves(self) -> None:
        """Move host-memory storages too (for tests on CPU-only machines: the same code path as on CUDA)."""
        self._params = StorageOffload(self.model.parameters(), skip_cpu=False) if self.param_offload else None
        if self._optimizer is not None:
            tensors = optimizer_tensors(self.optimizer, exclude=self.model.parameters())
            self._optimizer = StorageOffload(tensors, skip_cpu=False)
        self._skip_cpu = False

    @property
    def enabled(self) -> bool:
        return self.param_offload or self.grad_offload or self.optimizer_offload

    def offload(self) -> None:
        """Move the selected parts to host memory."""
        if self.grad_offload and (self._grads is None or not self._grads.offloaded):
            # gradients come and go (set to None between updates), so their storages are looked up each time
            self._grads = StorageOffload(gradient_tensors(self.model), skip_cpu=self._skip_cpu)
        parts = [self._params, self._optimizer, self._grads]
        for part in parts:
            if part is not None:
                part.offload()
        self.offloaded_bytes = sum(part.num_bytes for part in parts if part is not None and part.offloaded)
        if self.offloaded_bytes:
            # the device bytes went back to PyTorch's caching allocator: give them to the driver (another process)
            release_device_memory()

    def onload(self, *, training: bool) -> None:
        """Bring back what a phase needs: parameters always, gradients and optimizer state when ``training``."""
        if self._params is not None:
            self._params.onload()
        if training:
            for part in (self._grads, self._optimizer):
                if part is not None:
                    part.onload()

    @contextlib.contextmanager
    def phase(self, *, training: bool) -> Iterator[None]:
        """Run a phase with what it needs on the device, and offload the selected parts afterwards."""
        if not self.enabled:
            yield
            return
        self.onload(training=training)
        try:
            yield
        finally:
            self.offload()


def attach_offloader(owner: Any, megatron: Any, *, skip_cpu: bool = True) -> None:
    """Give an actor, reference or critic (``owner.model``, ``owner.optimizer``) the offloader its megatron section
    asks for, and move the selected parts out until the first phase needs them.

    Args:
        owner: the model's owner (``model`` and, when trained, ``optimizer`` attributes).
        megatron: its :class:`~verl.workers.config.MegatronConfig`.
        skip_cpu: leave host-memory tensors alone (tests turn it off to move CPU storages for real).
    """
    flags = {name: getattr(megatron, name) for name in ("param_offload", "grad_offload", "optimizer_offload")}
    if not any(flags.values()):
        owner.offloader = None
        return
    owner.offloader = MegatronOffloader(owner.model, getattr(owner, "optimizer", None), **flags)
    if not skip_cpu:
        owner.offloader.force_host_moves()
    owner.offloader.offload()
    logger.info("offload %s: %d bytes in host memory between phases", flags, owner.offloader.offloaded_bytes)


def offload_phase(owner: Any, *, training: bool) -> contextlib.AbstractContextManager:
    """The phase context of ``owner``'s offloader (:meth:`MegatronOffloader.phase`); a no-op without one."""
    offloader = getattr(owner, "offloader", None)
    return offloader.phase(training=training) if offloader is not None else contextlib.nullcontext()
