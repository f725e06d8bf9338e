"""Giving the GPU memory an offload freed back to the device, so that another process can use it.

Moving a role's tensors to host memory (FSDP2's ``CPUOffloadPolicy`` and ``optimizer_offload``, megatron's
storage offload, the reward model's ``param_offload``) frees their device blocks into PyTorch's CUDA caching
allocator, which keeps them reserved for this process: ``torch.cuda.memory_allocated`` drops, but
``torch.cuda.memory_reserved`` (what ``nvidia-smi`` and a vLLM engine or another role's process see as taken) does
not. :func:`release_device_memory` hands the unused cached blocks back to the driver. It is called once at the end
of each phase of an offloading role and after a rollout engine sleeps, never per micro-batch or optimizer step: it
waits for the device (a synchronisation), and every block the next phase needs is allocated from the driver again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def cuda_in_use() -> bool:
    """Whether this process has a CUDA context (CUDA is there and was used): only then is there memory to release."""
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def release_device_memory() -> bool:
    """Wait for the current device's queued work, then return the caching allocator's unused blocks to the driver.

    The synchronisation comes first: a block freed while a kernel or an asynchronous copy still uses it is only
    returned once that work is done, so without it some of the memory would stay reserved.

    Returns:
        True when CUDA memory was released; False where there is none to release (no CUDA, or CUDA never used by
        this process: its first use would create a context just to empty it).
    """
    if not cuda_in_use():
        return False
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return True


@contextlib.contextmanager
def releasing_device_memory(enabled: bool) -> Iterator[None]:
    """Run a phase, then :func:`release_device_memory` when ``enabled`` (also when the phase raised)."""
    try:
        yield
    finally:
        if enabled:
            release_device_memory()
