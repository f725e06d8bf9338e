"""Reading and checking the index of a ``torch.distributed.checkpoint`` (DCP) sharded checkpoint without unpickling.

DCP's ``.metadata`` file is a pickle. :func:`read_metadata` reads it with an unpickler that admits only DCP's own
metadata classes, torch sizes, dtypes and layouts, and paths, and refuses an index that describes non-tensor
entries (DCP would unpickle those on load). :func:`verify_sharded_checkpoint` adds a size check of every shard
file. This module sits below both :mod:`verl.utils.checkpoint`, whose ``verify_checkpoint`` checks the ``sharded/``
directory of a role, and :mod:`verl.utils.fsdp_checkpoint`, which writes and loads the shards, so neither imports
the other back.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from verl.utils.checkpoint_errors import CheckpointError

__all__ = ["METADATA_FILE", "SHARDED_DIR", "read_metadata", "verify_sharded_checkpoint"]

# the directory under a role's checkpoint that holds the DCP shards, and DCP's index file in it
SHARDED_DIR = "sharded"
METADATA_FILE = ".metadata"

# What DCP's metadata pickle may name: its own dataclasses, torch sizes, dtypes and layouts, a path.
_METADATA_MODULES = {"torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem"}
_TORCH_NAMES = {("torch", "Size"), ("torch.serialization", "_get_layout")}
_PATH_NAMES = {("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath")}


class _RefusedGlobal(pickle.UnpicklingError):
    """The metadata pickle names a global DCP metadata never holds (told apart from a truncated pickle)."""


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only the globals DCP metadata consists of; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        # a dotted name walks attributes (protocol 4: "os.system" reached through an allowed module): never
        allowed = "." not in name and (
            module in _METADATA_MODULES
            or (module, name) in _TORCH_NAMES
            or (module, name) in _PATH_NAMES
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            raise _RefusedGlobal(f"it names {module}.{name}, which DCP metadata never holds")
        found = super().find_class(module, name)
        if module in _METADATA_MODULES and not (isinstance(found, type) and found.__module__ == module):
            # of DCP's own modules only the classes they define (not a function or a module they import)
            raise _RefusedGlobal(f"it names {module}.{name}, which DCP metadata never holds")
        return found


def read_metadata(directory: str | os.PathLike) -> Metadata:
    """DCP's ``.metadata`` of a sharded checkpoint, checked: tensors only, every shard file present.

    Raises:
        CheckpointError: the file is missing or damaged, names a global DCP metadata never holds (refused without
            running any of it), describes non-tensor entries, or refers to a shard file that is missing.
    """
    directory = Path(directory)
    path = directory / METADATA_FILE
    if not path.is_file():
        raise CheckpointError(path, "is missing (the sharded checkpoint is incomplete)")
    try:
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except _RefusedGlobal as err:
        raise CheckpointError(path, f"was not written by this trainer: {err}; it was refused unexecuted") from err
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError, IndexError, KeyError) as err:
        # a truncated pickle ends in EOFError or UnpicklingError ("pickle data was truncated")
        raise CheckpointError(
            path, f"is damaged or was not written by this trainer ({err or type(err).__name__})"
        ) from err
    if not isinstance(metadata, Metadata):
        raise CheckpointError(path, f"was not written by this trainer (it holds a {type(metadata).__name__})")
    non_tensor = [k for k, v in metadata.state_dict_metadata.items() if not isinstance(v, TensorStorageMetadata)]
    if non_tensor:
        # DCP unpickles non-tensor entries with weights_only=False: never load them
        raise CheckpointError(path, f"describes non-tensor entries {non_tensor[:3]}, which this trainer never writes")
    files = sorted({info.relative_path for info in (metadata.storage_data or {}).values()})
    missing = [name for name in files if not (directory / name).is_file()]
    if missing:
        raise CheckpointError(directory / missing[0], "is missing (the sharded checkpoint is incomplete)")
    return metadata


def verify_sharded_checkpoint(directory: str | os.PathLike) -> Metadata:
    """:func:`read_metadata`, and every ``.distcp`` file at least as long as the index's last byte in it.

    Cheap (sizes only, no tensor is read): the driver runs it on the checkpoint it resumes from, and every rank
    before it loads, so that a truncated shard is named instead of failing inside DCP.

    Returns:
        The checkpoint's metadata.

    Raises:
        CheckpointError: as :func:`read_metadata`, or a shard file shorter than the index says (truncated).
    """
    directory = Path(directory)
    metadata = read_metadata(directory)
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), int(info.offset) + int(info.length))
    for name, end in sorted(needed.items()):
        size = (directory / name).stat().st_size
        if size < end:
            raise CheckpointError(
                directory / name,
                f"is damaged: {size} bytes, but {METADATA_FILE} places shard data up to byte {end} (an interrupted "
                "write or a truncated copy)",
            )
    return metadata
