"""CUDA stood in for in :mod:`verl.utils.device_memory`, recording what a release would have asked of it.

:func:`record_device_calls` makes :func:`~verl.utils.device_memory.cuda_in_use` answer True and replaces
``torch.cuda.synchronize`` and ``torch.cuda.empty_cache`` with recorders, so a CPU-only test sees every release an
offload path makes (the rest of torch still sees no CUDA). A test module wraps it in a fixture of its own.
"""

import torch

from verl.utils import device_memory


def record_device_calls(monkeypatch) -> list[str]:
    """The CUDA calls of every device-memory release from now on, in order ("synchronize", "empty_cache")."""
    calls: list[str] = []
    monkeypatch.setattr(device_memory, "cuda_in_use", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    return calls


def num_releases(calls: list[str]) -> int:
    """How many releases the recorded calls make up (each one a synchronize then an empty_cache)."""
    assert calls == ["synchronize", "empty_cache"] * (len(calls) // 2), calls
    return len(calls) // 2
