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
non-tensor entry is refused (:class:`~verl.utils.checkpoint_errors.CheckpointError`), so loading stays weights-only.

A damaged sharded checkpoint is reported by file, never as DCP's own exception: :func:`verify_sharded_checkpoint`
(run by the driver before a resume, and by every rank before it loads) checks that ``.metadata`` reads and that
every ``.distcp`` file is as long as the index says; a shard that still fails to read names its file. A failed
write while saving (disk full, read-only directory) raises :class:`~verl.utils.checkpoint_errors.CheckpointWriteError`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from verl.utils.checkpoint import WEIGHTS_FILE, save_weights
from verl.utils.checkpoint_errors import CheckpointError, CheckpointWriteError, describe_os_error
from verl.utils.dcp_metadata import (  # noqa: F401  (verl.utils.fsdp_checkpoint's public names)
    METADATA_FILE,
    SHARDED_DIR,
    read_metadata,
    verify_sharded_checkpoint,
)

logger = logging.getLogger(__name__)

HF_EXPORT_DIR = "huggingface"
_OPTIM_PREFIX = "optim."


class _WeightsOnlyReader(FileSystemReader):
    """DCP's file reader with :func:`read_metadata` instead of a bare ``pickle.load``, and a shard that fails to
    read named by its file (:class:`CheckpointError`)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        if rank is not None:  # DCP's no-collective mode keeps one metadata file per rank; we never write those
            raise CheckpointError(
                Path(str(self.path)) / f"__{rank}{METADATA_FILE}", "is not a file this trainer writes"
            )
        metadata = read_metadata(Path(str(self.path)))
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: Any, planner: Any) -> Any:
        # one file at a time, so that a failure names the file it came from
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        future = None
        for name, items in per_file.items():
            try:
                future = super().read_data(dataclasses.replace(plan, items=items), planner)
            except Exception as err:
                path = Path(str(self.path)) / name
                raise CheckpointError(path, f"could not be read ({_first_line(err)})") from err
        return future if future is not None else super().read_data(plan, planner)


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
    try:
        dcp.save(state, storage_writer=FileSystemWriter(directory), process_group=process_group)
    except CheckpointException as err:  # a BaseException: as it is, it would escape every `except Exception`
        raise _write_error(directory, err) from None


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
    metadata = verify_sharded_checkpoint(directory)
    model_state = module.state_dict()
    missing = [k for k in model_state if f"model.{k}" not in metadata.state_dict_metadata]
    if missing:
        raise CheckpointError(directory, f"lacks weights {missing[:5]} of this model; was it written for another?")
    state: dict[str, Any] = {"model": model_state}
    targets = _optimizer_targets(module, metadata, directory) if optimizer is not None else {}
    if targets:
        names = {param: name for name, param in _named_parameters(module).items()}
        state["optim"] = {f"{names[p]}.{k}": t for p, entries in targets.items() for k, t in entries.items()}
    try:
        dcp.load(state, storage_reader=_WeightsOnlyReader(directory), process_group=process_group)
    except CheckpointException as err:  # a BaseException: as it is, it would escape every `except Exception`
        raise _read_error(directory, err) from None
    module.load_state_dict(model_state)
    if optimizer is not None:
        optimizer.state.clear()
        for param in _named_parameters(module).values():  # in parameter order, as the optimizer creates them
            if param in targets:
                optimizer.state[param] = targets[param]


def _first_line(err: BaseException) -> str:
    """The first sentence of an error's message (torch's messages go on with advice), or its type's name."""
    text = str(err).strip()
    return text.splitlines()[0].split(". ", 1)[0].rstrip(".") if text else type(err).__name__


def _failures(err: CheckpointException) -> list[tuple[int, BaseException]]:
    """DCP's failures by rank (each stored as ``(exception, traceback)`` or the exception alone), lowest rank first."""
    failures = []
    for rank, failure in sorted(err.failures.items()):
        failures.append((rank, failure[0] if isinstance(failure, tuple) else failure))
    return failures


def _write_error(directory: Path, err: CheckpointException) -> BaseException:
    """The error a failed DCP save is reported as: the first OS error as :class:`CheckpointWriteError` naming the
    directory and the rank, or the first failure itself."""
    failures = _failures(err)
    for rank, failure in failures:
        if isinstance(failure, CheckpointWriteError):
            return failure
        if isinstance(failure, OSError):
            where = Path(failure.filename) if failure.filename else directory
            return CheckpointWriteError(where, f"{describe_os_error(failure)} (rank {rank}'s shards)", failure.errno)
    if failures and isinstance(failures[0][1], Exception):
        return failures[0][1]
    return RuntimeError(f"saving the sharded checkpoint {directory} failed: {_first_line(err)}")


def _read_error(directory: Path, err: CheckpointException) -> CheckpointError:
    """The error a failed DCP load is reported as: the first :class:`CheckpointError` (which names its file), or
    one naming the directory with the first failure."""
    failures = _failures(err)
    for _, failure in failures:
        if isinstance(failure, CheckpointError):
            return failure
    detail = _first_line(failures[0][1]) if failures else _first_line(err)
    return CheckpointError(directory, f"could not be read ({detail})")


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
        save_weights(directory / WEIGHTS_FILE, weights)
        return
    target = directory / Path(weights_file).name
    try:
        os.link(weights_file, target)  # no second copy of the weights on disk
    except OSError:
        shutil.copyfile(weights_file, target)


def is_sharded_checkpoint(role_dir: str | os.PathLike) -> bool:
    """Whether ``role_dir`` holds a DCP checkpoint (written by the ``fsdp2`` backend)."""
    return (Path(role_dir) / SHARDED_DIR / METADATA_FILE).is_file()
