"""The contract between the update loop and a training backend, what several backends share, and ``dp``/``fsdp2``.

The update loop (:mod:`verl.workers.actor.update_loop`, actor and critic alike) asks its :class:`TrainingBackend` how
to autocast a forward pass, how to run the backward over a mini-batch, how to step the optimizer, how to read the
loss scale and its floor, and how to save and load a checkpoint. The contract is narrow: everything a backend trains
with (module, optimizer, dtype, micro-batching rule, fire drill) is handed over once, as :class:`BackendParts`, when
the loop is built; per mini-batch the loop hands over the mini-batch and its loss functions (:class:`MiniBatchLoss`);
per checkpoint what is written and how to restore it (:class:`CheckpointContents`). A backend never sees the loop
itself.
Each backend answers every question in its own class body, so one backend reads top to bottom; what several do alike
is a plain function of this module. :class:`DPBackend` and :class:`FSDPBackend` live here, megatron-core's three
paths in :mod:`verl.workers.actor.megatron_backend`.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from verl.protocol import DataProto
from verl.utils.activation_offload import ActivationOffload
from verl.utils.checkpoint import (
    TRAIN_STATE_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    load_state,
    load_weights,
    save_state,
    save_weights,
)
from verl.utils.micro_batching import LockstepGroup, split_by_length
from verl.workers.actor.fault_injection import FaultInjector
from verl.workers.config.roles import TRAINING_STATE_PARTS

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from verl.workers.config.roles import MicroBatching


class FireDrillTarget(StrEnum):
    """Where the fire drill strikes: the gradients right before the step (the optimizer reduces them itself), or
    the micro-batch losses inside the backward (the gradients are reduced inside the backend's schedule, so the NaN
    must travel through that reduction as a real overflow would)."""

    GRADIENTS = "gradients"
    LOSS = "loss"


#: Every fire-drill target (kept for code that checks a value against the list).
FIRE_DRILL_TARGETS = tuple(FireDrillTarget)

StepResult = tuple[bool, float | None, int | None]


@dataclass(frozen=True)
class BackendParts:
    """What a backend trains with, handed over once when the loop is built (:meth:`TrainingBackend.attach`).

    Attributes:
        module: the trained module (unwrapped): its parameters' device, its checkpointed weights.
        optimizer: an optimizer with megatron-core's contract (``step() -> (successful, grad_norm, num_zeros)``,
            ``get_loss_scale()``, ``zero_grad()``, ``backward(loss)``, ``scale_loss(loss)``); None when frozen.
        dtype: the compute dtype.
        micro_batching: how a mini-batch splits into micro-batches.
        fault_injector: the fire drill (a backend that poisons losses uses it).
    """

    module: torch.nn.Module
    optimizer: Any
    dtype: torch.dtype
    micro_batching: MicroBatching
    fault_injector: FaultInjector


@dataclass(frozen=True)
class MiniBatchLoss:
    """One mini-batch and how its loss is computed, built by the loop for each mini-batch.

    Attributes:
        mini: the mini-batch.
        temperature: the sampling temperature its log-probs are taken at (None: the role has none).
        update_step: the 1-based number of the update this mini-batch's gradients feed (the fire drill's step).
        loss: ``micro -> (loss, metrics)``: runs the model forward on a micro-batch and returns its loss.
        loss_from_output: ``(micro, output) -> (loss, metrics)``: the loss from a forward pass the backend ran.
        weight: ``micro -> share``: the micro-batch's share of the mini-batch loss.
        note_loss: records a micro-batch's unscaled loss (before any scaling or poisoning) for the inf/NaN check.
    """

    mini: DataProto
    temperature: float | None
    update_step: int
    loss: Callable[[DataProto], tuple[torch.Tensor, dict[str, float]]]
    loss_from_output: Callable[[DataProto, Any], tuple[torch.Tensor, dict[str, float]]]
    weight: Callable[[DataProto], float]
    note_loss: Callable[[torch.Tensor], None]


@dataclass(frozen=True)
class CheckpointContents:
    """What a checkpoint holds beside the backend's own files, built by the loop for each save or load.

    Attributes:
        module: the trained module whose weights are written.
        training_state: returns the training state (optimizer, LR schedule, handler, counters) to write.
        load_training_state: restores a training state read back.
        hf_model: ``checkpoint.save_contents`` asks for a ``huggingface/`` export.
        peft_model: the ``peft.PeftModel`` of a LoRA run (its adapter directory is written too), else None.
        saved_parts: the parts of the training state a save writes (``checkpoint.save_contents`` of
            ``optimizer``, ``extra``); ``training_state`` already leaves the others out, and a backend that keeps
            optimizer state in files of its own writes them only with ``optimizer``.
        loaded_parts: the same for a load (``checkpoint.load_contents``).
    """

    module: torch.nn.Module
    training_state: Callable[[], dict[str, Any]]
    load_training_state: Callable[[dict[str, Any]], None]
    hf_model: bool = False
    peft_model: Any = None
    saved_parts: tuple[str, ...] = TRAINING_STATE_PARTS
    loaded_parts: tuple[str, ...] = TRAINING_STATE_PARTS


#: The key of a saved training state that lists the parts of it the checkpoint holds (of ``TRAINING_STATE_PARTS``).
PARTS_KEY = "training_state_parts"


def check_checkpoint_parts(directory: str | os.PathLike, parts: tuple[str, ...], section_key: str) -> None:
    """The checkpoint in ``directory`` holds the parts of the training state a resume is to read (``parts``): its
    ``train_state.pt`` lists those it was written with (one written before the list existed holds them all).

    Raises:
        CheckpointError: a part is missing; the message names it and the setting that resumes without it.
    """
    path = Path(directory) / TRAIN_STATE_FILE
    held = tuple(load_state(path, mmap=True).get(PARTS_KEY, TRAINING_STATE_PARTS))
    missing = [part for part in parts if part not in held]
    if missing:
        raise CheckpointError(
            path,
            f"holds no {' and no '.join(missing)} state: the run that wrote it saved {['model', *held]} "
            f"(checkpoint.save_contents), and {section_key}.checkpoint.load_contents asks for {missing}. To resume "
            f"from it with {' and '.join(missing)} fresh, leave {missing} out of {section_key}.checkpoint."
            "load_contents",
        )


class TrainingBackend(ABC):
    """What a backend answers for the update loop; see the module doc for the contract.

    ``fire_drill_target`` says where the loop's fire drill strikes (:class:`FireDrillTarget`).
    """

    name: str
    fire_drill_target: FireDrillTarget
    parts: BackendParts | None = None

    def attach(self, parts: BackendParts) -> None:
        """Take what this backend trains with (once, when the loop is built)."""
        self.parts = parts

    @abstractmethod
    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed-precision context of a forward pass (fp16/bf16 compute over fp32 master weights)."""

    @abstractmethod
    def lockstep(self) -> LockstepGroup | None:
        """The ranks that must run as many forward passes as this one (their every forward pass is a collective),
        or None; passes over micro-batches agree on the count over them (:func:`~verl.utils.micro_batching.
        split_by_length`)."""

    @abstractmethod
    def holds_a_copy_of_rows(self) -> bool:
        """Whether this rank's rows are a copy of another rank's (megatron: every rank of a model-parallel group
        takes the same rows, and the one that returns the group's results answers for them): a count summed over
        the ranks leaves it out, to count each row once."""

    @abstractmethod
    def backward_mini_batch(self, batch: MiniBatchLoss) -> list[dict[str, float]]:
        """Zero the gradients, then forward and backward every micro-batch of ``batch.mini``; returns their
        metrics."""

    @abstractmethod
    def step(self) -> StepResult:
        """The optimizer step: ``(successful, grad_norm, num_zeros_in_grad)``, agreed by every rank."""

    @abstractmethod
    def loss_scale(self) -> float | None:
        """The dynamic loss scale this step's gradients were computed with (None without dynamic scaling)."""

    @abstractmethod
    def min_loss_scale(self) -> float | None:
        """The loss scaler's floor (None without dynamic scaling)."""

    @abstractmethod
    def save_checkpoint(self, directory: str | os.PathLike, contents: CheckpointContents) -> None:
        """Write the weights and the training state to ``directory`` (the caller makes it atomic)."""

    @abstractmethod
    def load_checkpoint(self, directory: str | os.PathLike, contents: CheckpointContents) -> None:
        """Restore what :meth:`save_checkpoint` wrote: weights, then the training state."""


# ---------------------------------------------------------------------- what several backends do alike


def attached(backend: TrainingBackend) -> BackendParts:
    """The backend's parts; a backend used before the loop handed them over is a bug."""
    assert backend.parts is not None, f"{type(backend).__name__} used before attach(): build it through a loop"
    return backend.parts


def autocast_on(device_type: str, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """``torch.autocast`` in ``dtype`` on ``device_type``; nothing to do for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def parameter_device_type(module: torch.nn.Module) -> str:
    """Where ``module``'s parameters live (read each time: offloading may move them)."""
    return next(module.parameters()).device.type


def accumulate_micro_batches(
    parts: BackendParts,
    batch: MiniBatchLoss,
    lockstep: LockstepGroup | None,
    forward_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> list[dict[str, float]]:
    """Plain gradient accumulation: each micro-batch's loss, weighted by its share of the mini-batch, backward in
    turn; each forward pass inside a fresh ``forward_context()`` (the backward pass runs after it exits)."""
    parts.optimizer.zero_grad()
    all_metrics = []
    # similar lengths: little padding each
    micro_batches, _ = split_by_length(batch.mini, parts.micro_batching, lockstep)
    for micro in micro_batches:
        with forward_context():
            loss, metrics = batch.loss(micro)
        batch.note_loss(loss)
        parts.optimizer.backward(loss * batch.weight(micro))
        all_metrics.append(metrics)
    return all_metrics


def optimizer_loss_scale(optimizer: Any) -> float | None:
    """The scale an optimizer with megatron-core's contract reports (``get_loss_scale()``), as a float."""
    scale = optimizer.get_loss_scale()
    return None if scale is None else float(scale)


def _tied_aliases(weights: dict[str, torch.Tensor]) -> set[str]:
    # Tied output weights are saved once under the embedding name by some models; nothing is missing then.
    return {"lm_head.weight"} if "model.embed_tokens.weight" in weights else set()


def save_whole_checkpoint(directory: str | os.PathLike, contents: CheckpointContents, exports=None) -> None:
    """The whole weights to ``model.safetensors`` and the training state to ``train_state.pt``; then
    ``exports(directory, contents, weights)`` (default: :func:`save_exports`: a LoRA run's adapter directory; with
    ``checkpoint.save_contents`` holding ``hf_model``, the ``huggingface/`` export)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = contents.module.state_dict()
    save_weights(directory / WEIGHTS_FILE, weights)
    save_state(directory / TRAIN_STATE_FILE, contents.training_state())
    if exports is None:
        save_exports(directory, contents, weights, always_export=False)
    else:
        exports(directory, contents, weights)


def save_exports(
    directory: Path, contents: CheckpointContents, weights: dict[str, torch.Tensor], *, always_export: bool
) -> None:
    """What a checkpoint holds beside the training state (rank 0, ``weights`` the full state dict, already written
    to ``model.safetensors``):

    - a LoRA run: ``lora_adapter/``, the peft adapter directory ``lora_adapter_path`` and ``PeftModel`` load;
    - ``huggingface/``, a model directory ``transformers`` loads, when ``checkpoint.save_contents`` holds
      ``hf_model``, or always for a full fine-tuning run with ``always_export`` (fsdp2: a hard link of
      ``model.safetensors``, no second copy). A LoRA run's export holds the merged weights ``W + (alpha / r) B A``
      under the plain model's names (written: a second copy of the weights, hence only when asked for).
    """
    from verl.utils.fsdp_checkpoint import HF_EXPORT_DIR, export_huggingface

    module = contents.module
    if contents.peft_model is None:
        if contents.hf_model or always_export:
            export_huggingface(directory / HF_EXPORT_DIR, module, weights_file=directory / WEIGHTS_FILE)
        return
    from verl.utils.lora import LORA_ADAPTER_DIR, lora_scalings, merged_lora_weights, save_lora_adapter

    save_lora_adapter(directory / LORA_ADAPTER_DIR, contents.peft_model, weights)
    if contents.hf_model:
        merged = dict(merged_lora_weights(weights.items(), lora_scalings(module)))
        export_huggingface(directory / HF_EXPORT_DIR, module, weights=merged)


def load_whole_checkpoint(directory: str | os.PathLike, contents: CheckpointContents) -> None:
    """Restore what :func:`save_whole_checkpoint` wrote.

    Raises:
        ValueError: the weights do not fit the model.
    """
    directory = Path(directory)
    weights = load_weights(directory / WEIGHTS_FILE)
    missing, unexpected = contents.module.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state") and k not in _tied_aliases(weights)]
    if missing or unexpected:
        raise ValueError(
            f"{directory}: checkpoint weights do not fit the model (missing {missing[:5]}, unexpected "
            f"{list(unexpected)[:5]}); was it written for another model?"
        )
    contents.load_training_state(load_state(directory / TRAIN_STATE_FILE))


# ---------------------------------------------------------------------- the backends


class DPBackend(TrainingBackend):
    """``dp``: a replicated module in plain PyTorch; the optimizer (:class:`~verl.utils.amp_optimizer.AmpOptimizer`)
    averages the gradients over the process group inside its step, so the drill poisons them before it."""

    name = "dp"
    fire_drill_target = FireDrillTarget.GRADIENTS

    def autocast(self):
        parts = attached(self)
        return autocast_on(parameter_device_type(parts.module), parts.dtype)

    def lockstep(self):
        return None  # a replica per rank: the gradients are averaged once, in the step

    def holds_a_copy_of_rows(self):
        return False

    def backward_mini_batch(self, batch):
        return accumulate_micro_batches(attached(self), batch, self.lockstep())

    def step(self):
        return attached(self).optimizer.step()

    def loss_scale(self):
        return optimizer_loss_scale(attached(self).optimizer)

    def min_loss_scale(self):
        return getattr(attached(self).optimizer, "min_loss_scale", None)

    def save_checkpoint(self, directory, contents):
        save_whole_checkpoint(directory, contents)

    def load_checkpoint(self, directory, contents):
        load_whole_checkpoint(directory, contents)


class FSDPBackend(TrainingBackend):
    """``fsdp2``: a module sharded with FSDP2 over ``mesh``; the sharded optimizer
    (:class:`~verl.utils.fsdp_optimizer.ShardedAmpOptimizer`) reduces the verdict over the ranks in its step.

    Differs from ``dp`` in two places: autocast runs on the mesh's device (the parameters sit in CPU memory under
    offload), and checkpoints are sharded (:mod:`verl.utils.fsdp_checkpoint`), their save and load collective.
    With ``offload_activations`` each training forward pass keeps what it saves for the backward pass in CPU memory
    (verl's ``enable_activation_offload``, :class:`~verl.utils.activation_offload.ActivationOffload`).

    Args:
        mesh: the data-parallel mesh the module is sharded over.
        hf_export: also write a Hugging Face directory with each checkpoint (a ``transformers`` model).
        offload_activations: move the training forward's saved activations to CPU memory.
    """

    name = "fsdp2"
    fire_drill_target = FireDrillTarget.GRADIENTS

    def __init__(self, mesh: DeviceMesh, *, hf_export: bool = False, offload_activations: bool = False):
        self.mesh = mesh
        self.hf_export = hf_export
        self.offload_activations = offload_activations

    def autocast(self):
        return autocast_on(self.mesh.device_type, attached(self).dtype)

    def lockstep(self):
        """The mesh's ranks: each forward pass gathers the parameters from all of them, each backward reduces."""
        if self.mesh.size() == 1:
            return None
        return LockstepGroup(self.mesh.get_group(), self.mesh.device_type)

    def holds_a_copy_of_rows(self):
        return False  # each rank of the mesh takes rows of its own

    def backward_mini_batch(self, batch):
        return accumulate_micro_batches(attached(self), batch, self.lockstep(), self._forward_context)

    def _forward_context(self) -> contextlib.AbstractContextManager:
        if not self.offload_activations:
            return contextlib.nullcontext()
        return ActivationOffload(self.mesh.device_type)

    def step(self):
        return attached(self).optimizer.step()

    def loss_scale(self):
        return optimizer_loss_scale(attached(self).optimizer)

    def min_loss_scale(self):
        return getattr(attached(self).optimizer, "min_loss_scale", None)

    def save_checkpoint(self, directory, contents):
        """Collective: every rank writes its shards to ``sharded/``; rank 0 the gathered ``model.safetensors``,
        ``train_state.pt`` and the exports of :func:`save_exports` (``hf_export``: the ``huggingface/`` directory
        of a full fine-tuning run with every checkpoint)."""
        from verl.utils.fsdp_checkpoint import SHARDED_DIR, save_sharded
        from verl.utils.fsdp_utils import full_state_dict

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        optimizer = self._torch_optimizer() if "optimizer" in contents.saved_parts else None
        save_sharded(directory / SHARDED_DIR, contents.module, optimizer, self.mesh.get_group())
        weights = full_state_dict(contents.module)  # collective; only rank 0 receives the tensors
        if self.mesh.get_local_rank() != 0:
            return
        save_weights(directory / WEIGHTS_FILE, weights)
        save_state(directory / TRAIN_STATE_FILE, contents.training_state())
        save_exports(directory, contents, weights, always_export=self.hf_export)

    def load_checkpoint(self, directory, contents):
        """Collective: restore the shards of weights and optimizer state, then what every rank shares.

        Raises:
            CheckpointError: the directory has no sharded checkpoint (it was written by another backend), or a
                file is missing or damaged.
        """
        from verl.utils.checkpoint import CheckpointError
        from verl.utils.fsdp_checkpoint import SHARDED_DIR, load_sharded

        sharded = Path(directory) / SHARDED_DIR
        if not sharded.is_dir():
            raise CheckpointError(
                sharded,
                "is missing: this checkpoint was not written by the fsdp2 backend (dp and megatron write whole "
                "weights only), so its optimizer state cannot be resharded. Resume with the strategy that wrote it",
            )
        optimizer = self._torch_optimizer() if "optimizer" in contents.loaded_parts else None
        load_sharded(sharded, contents.module, optimizer, self.mesh.get_group())
        optimizer = attached(self).optimizer
        if optimizer is not None and optimizer.offload_state:
            optimizer.move_state(torch.device("cpu"))
        contents.load_training_state(load_state(Path(directory) / TRAIN_STATE_FILE))

    def _torch_optimizer(self) -> torch.optim.Optimizer | None:
        """The torch optimizer inside the sharded adapter, whose state the sharded checkpoint holds."""
        optimizer = attached(self).optimizer
        return None if optimizer is None else optimizer.optimizer
