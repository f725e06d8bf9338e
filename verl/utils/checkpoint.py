"""Checkpoint files: written atomically, read without unpickling arbitrary objects.

A checkpoint directory is assembled under a temporary name next to its final path and renamed into place only when
complete, so a crash mid-save never damages the last good checkpoint. Weights go to safetensors; training state
(optimizer moments, loss scaler, LR schedule, handler counters, data position) to ``torch.save`` files made of
tensors and plain Python values, which load with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

STEP_DIR_PATTERN = re.compile(r"^global_step_(\d+)$")


@contextlib.contextmanager
def atomic_directory(final_path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``final_path`` when the block finishes without error."""
    final = Path(final_path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def save_weights(path: str | os.PathLike, state_dict: dict[str, Any]) -> None:
    """Tensors of ``state_dict`` to safetensors (non-tensor entries such as ``_extra_state`` are skipped)."""
    tensors = {}
    for key, value in state_dict.items():
        if isinstance(value, torch.Tensor):
            # clone: tied weights share storage, which safetensors refuses to write twice
            tensors[key] = value.detach().to("cpu").contiguous().clone()
    save_file(tensors, str(path))


def load_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def save_state(path: str | os.PathLike, state: Any) -> None:
    torch.save(state, str(path))


def load_state(path: str | os.PathLike) -> Any:
    return torch.load(str(path), map_location="cpu", weights_only=True)


def find_latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The ``global_step_N`` directory under ``root`` with the largest N, or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    steps = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR_PATTERN.match(p.name))]
    return max(steps)[1] if steps else None


def step_of_checkpoint(path: str | os.PathLike) -> int:
    match = STEP_DIR_PATTERN.match(Path(path).name)
    if not match:
        raise ValueError(f"{path} is not a checkpoint directory (expected a name like global_step_10).")
    return int(match.group(1))
