"""Checkpoints of a megatron-core model split over ranks (tensor-parallel shards, pipeline stages): one shard
directory per rank of the model-parallel group, plus the gathered whole weights.

Layout of a checkpoint directory written with tensor-parallel size ``n`` (and ``p`` pipeline stages):

- ``mp_rank_XX/model.safetensors`` and ``mp_rank_XX/train_state.pt`` for ``XX`` in ``00 .. n-1`` (with stages
  ``mp_rank_XX_YYY`` for stage ``YYY`` in ``000 .. p-1``, megatron's naming): that rank's weight shards under its
  own names and its training state (its optimizer moments belong to its shards; the loss scale, the LR schedule
  and the update-outcome handler are the same on every rank, as every rank takes the same decisions);
- ``model.safetensors`` and ``train_state.pt``: the whole weights under megatron names, gathered over the
  tensor-parallel group and the stages (what a whole model writes), with rank 0's training state; and, when
  ``checkpoint.save_contents`` holds ``hf_model``, ``huggingface/`` (:func:`export_huggingface_weights`), as a
  whole model writes it.

Only the ranks of data-parallel rank 0 write (the other data-parallel ranks hold the same shards); saving is a
collective of their model-parallel group, because the gathering is; loading reads each rank's own shards.

With megatron-core's distributed optimizer (``megatron.use_distributed_optimizer``, the GPU path) the data-parallel
ranks do not hold the same optimizer state: each holds a share of the fp32 main weights and of the moments, and the
optimizer's ``state_dict()`` holds neither. :func:`save_distributed_optimizer_state` gathers them over the
data-parallel group into ``distrib_optim.pt`` (megatron's name), next to the weights (in the shard directory of a
split model), and :func:`load_distributed_optimizer_state` scatters them back; both are collectives of that group.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from verl.utils.checkpoint import (
    TRAIN_STATE_FILE,
    WEIGHTS_FILE,
    load_state,
    load_weights,
    save_state,
    save_weights,
    shard_name,
)

HF_EXPORT_DIR = "huggingface"
DISTRIBUTED_OPTIMIZER_FILE = "distrib_optim.pt"


def shard_directory(directory: str | os.PathLike, tp_rank: int, stage: int | None = None) -> Path:
    """Where tensor-parallel rank ``tp_rank`` (of pipeline stage ``stage``, None without stages) keeps its shards
    inside a checkpoint directory."""
    return Path(directory) / shard_name(tp_rank, stage)


def _ranks() -> tuple[int, int | None, int]:
    """(tensor-parallel rank, pipeline stage or None without stages, data-parallel rank) of this rank."""
    from megatron.core import parallel_state

    stage = None
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        stage = parallel_state.get_pipeline_model_parallel_rank()
    return (
        parallel_state.get_tensor_model_parallel_rank(),
        stage,
        parallel_state.get_data_parallel_rank(),
    )


def save_tensor_parallel_checkpoint(
    training_state: Callable[[], dict[str, Any]],
    module: torch.nn.Module,
    directory: str | os.PathLike,
    hf_config: Any = None,
) -> None:
    """Write this rank's shards and, on the model-parallel group's first rank, the gathered weights (a collective).

    Args:
        training_state: returns the training state to save (optimizer, LR schedule, handler, counters).
        module: the GPTModel (this rank's part).
        directory: the checkpoint directory.
        hf_config: the Hugging Face config, for the ``huggingface/`` export (None: no export).
    """
    from verl.models.mcore.weight_converter import gather_model_parallel_state_dict

    tp_rank, stage, dp_rank = _ranks()
    if dp_rank != 0:
        return
    shards = shard_directory(directory, tp_rank, stage)
    shards.mkdir(parents=True, exist_ok=True)
    state = {k: v for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}
    save_weights(shards / WEIGHTS_FILE, state)
    save_state(shards / TRAIN_STATE_FILE, training_state())
    full = gather_model_parallel_state_dict(module, state)
    if tp_rank != 0 or stage not in (None, 0):
        return
    save_weights(Path(directory) / WEIGHTS_FILE, full)
    # the files every checkpoint has at its top (the driver checks them before resuming); the shards' own
    # training states are what a resume loads
    save_state(Path(directory) / TRAIN_STATE_FILE, training_state())
    if hf_config is not None:
        export_huggingface_weights(directory, full, hf_config)


def export_huggingface_weights(directory: str | os.PathLike, full: dict[str, torch.Tensor], hf_config: Any) -> None:
    """``<directory>/huggingface/``: the Hugging Face config and the whole weights under Hugging Face names (LoRA
    adapters merged into their layers), a model directory ``transformers`` loads once the worker adds the tokenizer.

    Args:
        directory: the checkpoint directory.
        full: the whole (gathered) GPTModel state dict, megatron names.
        hf_config: the Hugging Face config the model was built from.
    """
    from verl.models.mcore.lora import merge_lora_state_dict
    from verl.models.mcore.weight_converter import mcore_to_hf_state_dict

    norm_in_linear = any(k.endswith("linear_qkv.layer_norm_weight") for k in full)
    hf = mcore_to_hf_state_dict(merge_lora_state_dict(full), hf_config, norm_in_linear=norm_in_linear)
    export = Path(directory) / HF_EXPORT_DIR
    export.mkdir(parents=True, exist_ok=True)
    hf_config.save_pretrained(export)
    save_weights(export / WEIGHTS_FILE, hf)


def load_tensor_parallel_checkpoint(
    load_training_state: Callable[[dict[str, Any]], None], module: torch.nn.Module, directory: str | os.PathLike
) -> None:
    """Restore this rank's shards and, through ``load_training_state``, its training state from
    :func:`save_tensor_parallel_checkpoint`'s layout.

    Raises:
        CheckpointError: this rank's shard files are missing or damaged (e.g. written with another
            tensor-parallel size or number of stages).
        ValueError: the shards do not fit the model.
    """
    tp_rank, stage, _ = _ranks()
    shards = shard_directory(directory, tp_rank, stage)
    weights = load_weights(shards / WEIGHTS_FILE)
    missing, unexpected = module.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise ValueError(
            f"{shards}: shards do not fit the model (missing {missing[:5]}, unexpected {list(unexpected)[:5]}); "
            "was the checkpoint written with another model or model-parallel layout?"
        )
    load_training_state(load_state(shards / TRAIN_STATE_FILE))


def distributed_optimizer(optimizer: Any, use_distributed_optimizer: bool) -> Any | None:
    """megatron-core's ``optimizer`` when it shards its state over the data-parallel ranks (the section's
    ``megatron.use_distributed_optimizer``), the one under a chain of one; else None (also for a frozen model)."""
    if optimizer is None or not use_distributed_optimizer:
        return None
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is not None:
        # a dense GPTModel gets one sub-optimizer (a second one holds MoE expert parameters only)
        assert len(chained) == 1, f"expected one chained optimizer, got {len(chained)}"
        optimizer = chained[0]
    return optimizer


def _distributed_optimizer_file(directory: str | os.PathLike, split: bool) -> Path:
    if not split:
        return Path(directory) / DISTRIBUTED_OPTIMIZER_FILE
    tp_rank, stage, _ = _ranks()
    return shard_directory(directory, tp_rank, stage) / DISTRIBUTED_OPTIMIZER_FILE


def save_distributed_optimizer_state(
    optimizer: Any, directory: str | os.PathLike, *, split: bool, with_state: bool = True
) -> bool:
    """With a distributed optimizer (``optimizer``, from :func:`distributed_optimizer`; None without one), gather
    its fp32 main weights and moments over the data-parallel group and write them on its rank 0 (a collective:
    every data-parallel rank calls it); nothing is gathered or written without ``with_state`` (a checkpoint without
    the optimizer's state). Returns whether this rank writes the rest of the checkpoint (data-parallel rank 0, or
    every rank without a distributed optimizer)."""
    if optimizer is None:
        return True
    if not with_state:
        return _ranks()[2] == 0
    state = optimizer.get_parameter_state_dp_zero()  # None on the other data-parallel ranks
    if _ranks()[2] != 0:
        return False
    path = _distributed_optimizer_file(directory, split)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_state(path, state)
    return True


def load_distributed_optimizer_state(optimizer: Any, directory: str | os.PathLike, *, split: bool) -> None:
    """Into ``optimizer`` (from :func:`distributed_optimizer`; None: nothing to do), scatter what
    :func:`save_distributed_optimizer_state` wrote over the data-parallel group (a collective), after the
    optimizer's ``state_dict`` was loaded (which leaves the moments uninitialised), so that the next step starts
    from the saved fp32 main weights and moments.

    Raises:
        CheckpointError: the file is missing or damaged (data-parallel rank 0 reads it; the others then wait in
            the group's collective until their timeout).
    """
    if optimizer is None:
        return
    state = load_state(_distributed_optimizer_file(directory, split)) if _ranks()[2] == 0 else None
    optimizer.load_parameter_state_from_dp_zero(state)
