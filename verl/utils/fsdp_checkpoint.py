"""Sharded checkpoints of FSDP2 models with ``torch.distributed.checkpoint`` (DCP), read without unpickling.

Layout of one role directory written by the ``fsdp2`` backend (the trainer makes the whole ``global_step_N``
directory atomic)::

    <role>/sharded/.metadata            # DCP's index of every shard (rank 0 writes it)
    <role>/sharded/__<R>_0.distcp       # rank R's shards of the weights and of the optimizer moments
    <role>/model.safetensors            # the whole fp32 weights, gathered (as every backend writes them)
    <role>/train_state.pt               # what every rank shares: LR schedule, loss scale, handler, counters
    <role>/huggingface/                 # actor only: config.json + model.safetensors that transformers loads

DCP stores only tensors here: the weights (``DTensor`` shards) and the per-parameter optimizer state keyed
``optim.<param name>.<state key>``; an empty optimizer state (no update applied yet) is saved as nothing, never
initialised by a fake step (``get_optimizer_state_dict`` would take one, which would break a bit-exact resume).
Non-tensor entries would be unpickled by DCP on load, and its ``.metadata`` file is a pickle: it is read here with
an unpickler that admits only DCP's own metadata classes, torch sizes and dtypes, and a checkpoint with any
non-tensor entry is refused (:class:`~verl.utils.checkpoint.CheckpointError`), so loading stays weights-only.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from verl.utils.checkpoint import CheckpointError

logger = logging.getLogger(__name__)

SHARDED_DIR = "sharded"
HF_EXPORT_DIR = "huggingface"
_METADATA_FILE = ".metadata"
_OPTIM_PREFIX = "optim."

# What DCP's metadata pickle may name: its own dataclasses, torch sizes, dtypes and layouts, a path.
_METADATA_MODULES = {"torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem"}
_TORCH_NAMES = {("torch", "Size"), ("torch.serialization", "_get_layout")}
_PATH_NAMES = {("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath")}


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only the globals DCP metadata consists of; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = (
            module in _METADATA_MODULES
            or (module, name) in _TORCH_NAMES
            or (module, name) in _PATH_NAMES
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which DCP metadata never holds")
        return super().find_class(module, name)


def read_metadata(directory: str | os.PathLike) -> Metadata:
    """DCP's ``.metadata`` of a sharded checkpoint, checked: tensors only, every shard file present.

    Raises:
        CheckpointError: the file is missing or damaged, names a global DCP metadata never holds (refused without
            running any of it), describes non-tensor entries, or refers to a shard file that is missing.
    """
    directory = Path(directory)
    path = directory / _METADATA_FILE
    if not path.is_file():
        raise CheckpointError(path, "is missing (the sharded checkpoint is incomplete)")
    try:
        with open(path, "rb") as handle:
            metadata = _MetadataUnpickler(handle).load()
    except pickle.UnpicklingError as err:
        raise CheckpointError(path, f"was not written by this trainer: {err}; it was refused unexecuted") from err
    except (EOFError, AttributeError, ValueError, TypeError, IndexError) as err:
        raise CheckpointError(path, f"is damaged or was not written by this trainer ({err})") from err
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


class _WeightsOnlyReader(FileSystemReader):
    """DCP's file reader with :func:`read_metadata` instead of a bare ``pickle.load``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        if rank is not None:  # DCP's no-collective mode keeps one metadata file per rank; we never write those
            raise CheckpointError(
                Path(str(self.path)) / f"__{rank}{_METADATA_FILE}", "is not a file this trainer writes"
            )
        metadata = read_metadata(Path(str(self.path)))
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _named_parameters(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    # named_parameters() names a tied parameter once (under its first name), as the optimizer holds it once
    return dict(module.named_parameters())


def optimizer_state_tensors(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The per-parameter optimizer state keyed ``<param name>.<state key>`` (``DTensor`` shards and scalars)."""
    states = {}
    for name, param in _named_parameters(module).items():
        for key, value in optimizer.state.get(param, {}).items():
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"optimizer state {name}.{key} is a {type(value).__name__}; only tensors are saved")
            states[f"{name}.{key}"] = value
    return states


def save_sharded(
    directory: str | os.PathLike, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, process_group
) -> None:
    """Write the shards of ``module`` (and of ``optimizer``'s state) with DCP: each rank writes its own file.

    Collective over ``process_group``; rank 0 also writes ``.metadata``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {"model": module.state_dict()}
    if optimizer is not None:
        state["optim"] = optimizer_state_tensors(module, optimizer)
    dcp.save(state, storage_writer=FileSystemWriter(directory), process_group=process_group)


def _optimizer_targets(
    module: torch.nn.Module, metadata: Metadata, directory: Path
) -> dict[torch.nn.Parameter, dict[str, torch.Tensor]]:
    """Empty tensors shaped like the saved optimizer state, sharded like the parameters they belong to."""
    params = _named_parameters(module)
    targets: dict[torch.nn.Parameter, dict[str, torch.Tensor]] = {}
    for flat_key, entry in metadata.state_dict_metadata.items():
        if not flat_key.startswith(_OPTIM_PREFIX):
            continue
        name, state_key = flat_key[len(_OPTIM_PREFIX) :].rsplit(".", 1)
        if name not in params:
            raise CheckpointError(directory, f"holds optimizer state of {name}, which this model lacks")
        param, dtype = params[name], entry.properties.dtype
        if tuple(entry.size) == tuple(param.shape):  # moments: sharded exactly like the parameter
            target = torch.zeros_like(param, dtype=dtype)
        else:  # scalars such as Adam's step count, replicated
            target = torch.zeros(tuple(entry.size), dtype=dtype)
        targets.setdefault(param, {})[state_key] = target.detach()
    return targets


def load_sharded(
    directory: str | os.PathLike, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, process_group
) -> None:
    """Read what :func:`save_sharded` wrote into ``module`` (and ``optimizer``): each rank reads its shards.

    Collective over ``process_group``. Shards are resharded by DCP when the world size differs from the saving
    run's (the loss-scale and schedule state is world-size independent).

    Raises:
        CheckpointError: the sharded checkpoint is missing, damaged, not tensors only, or for another model.
    """
    directory = Path(directory)
    metadata = read_metadata(directory)
    model_state = module.state_dict()
    missing = [k for k in model_state if f"model.{k}" not in metadata.state_dict_metadata]
    if missing:
        raise CheckpointError(directory, f"lacks weights {missing[:5]} of this model; was it written for another?")
    state: dict[str, Any] = {"model": model_state}
    targets = _optimizer_targets(module, metadata, directory) if optimizer is not None else {}
    if targets:
        names = {param: name for name, param in _named_parameters(module).items()}
        state["optim"] = {f"{names[p]}.{k}": t for p, entries in targets.items() for k, t in entries.items()}
    dcp.load(state, storage_reader=_WeightsOnlyReader(directory), process_group=process_group)
    module.load_state_dict(model_state)
    if optimizer is not None:
        optimizer.state.clear()
        for param in _named_parameters(module).values():  # in parameter order, as the optimizer creates them
            if param in targets:
                optimizer.state[param] = targets[param]


def export_huggingface(
    directory: str | os.PathLike,
    model: Any,
    weights_file: str | os.PathLike | None = None,
    weights: dict[str, Any] | None = None,
) -> None:
    """A directory ``transformers`` loads: ``config.json``, the generation config (if any) and the full weights.

    Rank 0 only. Either the weights are already on disk (``weights_file``, the role's ``model.safetensors``, same
    tensors and names: hard-linked where the file system allows, copied otherwise) or they are given
    (``weights``, e.g. a LoRA model's merged weights, written here).

    Args:
        directory: where to write (created).
        model: the Hugging Face model (sharded or not): its ``config`` and ``generation_config`` are written.
        weights_file: the gathered full weights, already written.
        weights: the weights to write instead, under the Hugging Face model's names.
    """
    if (weights_file is None) == (weights is None):
        raise ValueError("export_huggingface takes exactly one of weights_file and weights")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(directory)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(directory)
    if weights is not None:
        from verl.utils.checkpoint import WEIGHTS_FILE, save_weights

        save_weights(directory / WEIGHTS_FILE, weights)
        return
    target = directory / Path(weights_file).name
    try:
        os.link(weights_file, target)  # no second copy of the weights on disk
    except OSError:
        shutil.copyfile(weights_file, target)


def is_sharded_checkpoint(role_dir: str | os.PathLike) -> bool:
    """Whether ``role_dir`` holds a DCP checkpoint (written by the ``fsdp2`` backend)."""
    return (Path(role_dir) / SHARDED_DIR / _METADATA_FILE).is_file()
