"""How each training backend runs the shared update loop: one class per backend, every difference in it.

:class:`~verl.workers.actor.update_loop.UpdateLoop` (actor and critic alike) asks its :class:`TrainingBackend` these
questions and nothing else about the backend: how to autocast a forward pass, how to run the backward over a
mini-batch's micro-batches, where the fire drill poisons (the gradients before the step, or the losses inside the
backward), how to step the optimizer, how to read the loss scale and its floor, and how to save and load a
checkpoint. :class:`DPBackend` (plain PyTorch), :class:`FSDPBackend` (FSDP2) and :class:`MegatronBackend`
(megatron-core, GPU or CPU path) each answer all of them in their own class body, so one backend reads top to bottom
without walking a class hierarchy; what several backends do alike is a plain function of this module that each one
calls by name. How a model runs forward stays with the model's class (``forward_logits``, ``_forward_values``).
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from verl.protocol import DataProto
from verl.utils.checkpoint import TRAIN_STATE_FILE, WEIGHTS_FILE, load_state, load_weights, save_state, save_weights
from verl.utils.micro_batching import LockstepGroup, split_by_length

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from verl.workers.actor.update_loop import UpdateLoop

#: Where the fire drill may strike: the gradients before the step, or the micro-batch losses inside the backward.
FIRE_DRILL_TARGETS = ("gradients", "loss")

StepResult = tuple[bool, float | None, int | None]


class TrainingBackend(ABC):
    """What a backend answers for the update loop; every method gets the loop (``loop``) it serves.

    ``fire_drill_target`` is ``"gradients"`` when the optimizer reduces the gradients itself (the loop poisons them
    right before the step) or ``"loss"`` when they are reduced inside the backend's backward schedule (the backward
    poisons the micro-batch losses, so the NaN travels through the reduction as a real overflow would).
    """

    name: str
    fire_drill_target: str

    @abstractmethod
    def autocast(self, loop: UpdateLoop) -> contextlib.AbstractContextManager:
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
    def backward_mini_batch(self, loop: UpdateLoop, mini: DataProto, temperature: float | None) -> list[dict]:
        """Zero the gradients, then forward and backward every micro-batch of ``mini``; returns their metrics."""

    @abstractmethod
    def step(self, loop: UpdateLoop) -> StepResult:
        """The optimizer step: ``(successful, grad_norm, num_zeros_in_grad)``, agreed by every rank."""

    @abstractmethod
    def loss_scale(self, loop: UpdateLoop) -> float | None:
        """The dynamic loss scale this step's gradients were computed with (None without dynamic scaling)."""

    @abstractmethod
    def min_loss_scale(self, loop: UpdateLoop) -> float | None:
        """The loss scaler's floor (None without dynamic scaling)."""

    @abstractmethod
    def save_checkpoint(self, loop: UpdateLoop, directory: str | os.PathLike) -> None:
        """Write the weights and the training state to ``directory`` (the caller makes it atomic)."""

    @abstractmethod
    def load_checkpoint(self, loop: UpdateLoop, directory: str | os.PathLike) -> None:
        """Restore what :meth:`save_checkpoint` wrote: weights, optimizer, loss scaler, LR schedule, handler."""


# ---------------------------------------------------------------------- what several backends do alike


def autocast_on(device_type: str, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """``torch.autocast`` in ``dtype`` on ``device_type``; nothing to do for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def parameter_device_type(loop: UpdateLoop) -> str:
    return next(loop.model_module().parameters()).device.type


def accumulate_micro_batches(loop: UpdateLoop, mini: DataProto, temperature: float | None) -> list[dict]:
    """Plain gradient accumulation: each micro-batch's loss, weighted by its share of ``mini``, backward in turn."""
    loop.optimizer.zero_grad()
    all_metrics = []
    # similar lengths: little padding each
    micro_batches, _ = split_by_length(mini, loop.micro_batching, loop.backend.lockstep())
    for micro in micro_batches:
        loss, metrics = loop._micro_batch_loss(micro, temperature)
        loop.note_loss(loss)
        loop.optimizer.backward(loss * loop._micro_batch_weight(micro, mini))
        all_metrics.append(metrics)
    return all_metrics


def optimizer_loss_scale(optimizer: Any) -> float | None:
    """The scale an optimizer with megatron-core's contract reports (``get_loss_scale()``), as a float."""
    scale = optimizer.get_loss_scale()
    return None if scale is None else float(scale)


def _tied_aliases(weights: dict[str, torch.Tensor]) -> set[str]:
    # Tied output weights are saved once under the embedding name by some models; nothing is missing then.
    return {"lm_head.weight"} if "model.embed_tokens.weight" in weights else set()


def save_whole_checkpoint(loop: UpdateLoop, directory: str | os.PathLike, exports=None) -> None:
    """The whole weights to ``model.safetensors`` and the training state to ``train_state.pt``; then
    ``exports(loop, directory, weights)`` (default: :func:`save_exports` of a Hugging Face module: a LoRA run's
    adapter directory; with ``checkpoint.save_contents`` holding ``hf_model``, the ``huggingface/`` export)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = loop.model_module().state_dict()
    save_weights(directory / WEIGHTS_FILE, weights)
    save_state(directory / TRAIN_STATE_FILE, loop.training_state_dict())
    if exports is None:
        save_exports(loop, directory, weights, always_export=False)
    else:
        exports(loop, directory, weights)


def save_exports(loop: UpdateLoop, directory: Path, weights: dict[str, torch.Tensor], *, always_export: bool) -> None:
    """What a checkpoint holds beside the training state (rank 0, ``weights`` the full state dict, already written
    to ``model.safetensors``):

    - a LoRA run: ``lora_adapter/``, the peft adapter directory ``lora_adapter_path`` and ``PeftModel`` load;
    - ``huggingface/``, a model directory ``transformers`` loads, when ``checkpoint.save_contents`` holds
      ``hf_model``, or always for a full fine-tuning run with ``always_export`` (fsdp2: a hard link of
      ``model.safetensors``, no second copy). A LoRA run's export holds the merged weights ``W + (alpha / r) B A``
      under the plain model's names (written: a second copy of the weights, hence only when asked for).
    """
    from verl.utils.fsdp_checkpoint import HF_EXPORT_DIR, export_huggingface

    module = loop.model_module()
    checkpoint = getattr(loop.config, "checkpoint", None)
    asked = checkpoint is not None and checkpoint.hf_model
    peft_model = getattr(loop, "peft_model", None)
    if peft_model is None:
        if asked or always_export:
            export_huggingface(directory / HF_EXPORT_DIR, module, weights_file=directory / WEIGHTS_FILE)
        return
    from verl.utils.lora import LORA_ADAPTER_DIR, lora_scalings, merged_lora_weights, save_lora_adapter

    save_lora_adapter(directory / LORA_ADAPTER_DIR, peft_model, weights)
    if asked:
        merged = dict(merged_lora_weights(weights.items(), lora_scalings(module)))
        export_huggingface(directory / HF_EXPORT_DIR, module, weights=merged)


def load_whole_checkpoint(loop: UpdateLoop, directory: str | os.PathLike) -> None:
    """Restore what :func:`save_whole_checkpoint` wrote.

    Raises:
        ValueError: the weights do not fit the model.
    """
    directory = Path(directory)
    weights = load_weights(directory / WEIGHTS_FILE)
    missing, unexpected = loop.model_module().load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state") and k not in _tied_aliases(weights)]
    if missing or unexpected:
        raise ValueError(
            f"{directory}: checkpoint weights do not fit the model (missing {missing[:5]}, unexpected "
            f"{list(unexpected)[:5]}); was it written for another model?"
        )
    loop.load_training_state_dict(load_state(directory / TRAIN_STATE_FILE))


# ---------------------------------------------------------------------- the backends


class DPBackend(TrainingBackend):
    """``dp``: a replicated module in plain PyTorch; the optimizer (:class:`~verl.utils.amp_optimizer.AmpOptimizer`)
    averages the gradients over the process group inside its step, so the drill poisons them before it."""

    name = "dp"
    fire_drill_target = "gradients"

    def autocast(self, loop):
        return autocast_on(parameter_device_type(loop), loop.dtype)

    def lockstep(self):
        return None  # a replica per rank: the gradients are averaged once, in the step

    def holds_a_copy_of_rows(self):
        return False

    def backward_mini_batch(self, loop, mini, temperature):
        return accumulate_micro_batches(loop, mini, temperature)

    def step(self, loop):
        return loop.optimizer.step()

    def loss_scale(self, loop):
        return optimizer_loss_scale(loop.optimizer)

    def min_loss_scale(self, loop):
        return getattr(loop.optimizer, "min_loss_scale", None)

    def save_checkpoint(self, loop, directory):
        save_whole_checkpoint(loop, directory)

    def load_checkpoint(self, loop, directory):
        load_whole_checkpoint(loop, directory)


class FSDPBackend(TrainingBackend):
    """``fsdp2``: a module sharded with FSDP2 over ``mesh``; the sharded optimizer
    (:class:`~verl.utils.fsdp_optimizer.ShardedAmpOptimizer`) reduces the verdict over the ranks in its step.

    Differs from ``dp`` in two places: autocast runs on the mesh's device (the parameters sit in CPU memory under
    offload), and checkpoints are sharded (:mod:`verl.utils.fsdp_checkpoint`), their save and load collective.

    Args:
        mesh: the data-parallel mesh the module is sharded over.
        hf_export: also write a Hugging Face directory with each checkpoint (a ``transformers`` model).
    """

    name = "fsdp2"
    fire_drill_target = "gradients"

    def __init__(self, mesh: DeviceMesh, *, hf_export: bool = False):
        self.mesh = mesh
        self.hf_export = hf_export

    def autocast(self, loop):
        return autocast_on(self.mesh.device_type, loop.dtype)

    def lockstep(self):
        """The mesh's ranks: each forward pass gathers the parameters from all of them, each backward reduces."""
        if self.mesh.size() == 1:
            return None
        return LockstepGroup(self.mesh.get_group(), self.mesh.device_type)

    def holds_a_copy_of_rows(self):
        return False  # each rank of the mesh takes rows of its own

    def backward_mini_batch(self, loop, mini, temperature):
        return accumulate_micro_batches(loop, mini, temperature)

    def step(self, loop):
        return loop.optimizer.step()

    def loss_scale(self, loop):
        return optimizer_loss_scale(loop.optimizer)

    def min_loss_scale(self, loop):
        return getattr(loop.optimizer, "min_loss_scale", None)

    def save_checkpoint(self, loop, directory):
        """Collective: every rank writes its shards to ``sharded/``; rank 0 the gathered ``model.safetensors``,
        ``train_state.pt`` and the exports of :func:`save_exports` (``hf_export``: the ``huggingface/`` directory
        of a full fine-tuning run with every checkpoint)."""
        from verl.utils.fsdp_checkpoint import SHARDED_DIR, save_sharded
        from verl.utils.fsdp_utils import full_state_dict

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        module = loop.model_module()
        save_sharded(directory / SHARDED_DIR, module, _torch_optimizer(loop), self.mesh.get_group())
        weights = full_state_dict(module)  # collective; only rank 0 receives the tensors
        if self.mesh.get_local_rank() != 0:
            return
        save_weights(directory / WEIGHTS_FILE, weights)
        save_state(directory / TRAIN_STATE_FILE, loop.training_state_dict())
        save_exports(loop, directory, weights, always_export=self.hf_export)

    def load_checkpoint(self, loop, directory):
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
        load_sharded(sharded, loop.model_module(), _torch_optimizer(loop), self.mesh.get_group())
        if loop.optimizer is not None and loop.optimizer.offload_state:
            loop.optimizer.move_state(torch.device("cpu"))
        loop.load_training_state_dict(load_state(Path(directory) / TRAIN_STATE_FILE))


def _torch_optimizer(loop: UpdateLoop) -> torch.optim.Optimizer | None:
    """The torch optimizer inside the sharded adapter, whose state the sharded checkpoint holds."""
    return None if loop.optimizer is None else loop.optimizer.optimizer


class MegatronBackend(TrainingBackend):
    """``megatron``: a megatron-core GPTModel, on one of two paths.

    - GPU path (``use_megatron_schedule``): fp16/bf16 parameters in megatron-core's DDP, its optimizer and its
      forward/backward schedule, which reduces the gradients inside the backward, so the drill poisons the losses;
      no autocast (the parameters already are in the compute dtype); outside fp16 megatron-core would apply
      non-finite gradients, so the step checks them first; its optimizer does not expose the loss scale's floor,
      which comes from the config instead.
    - CPU path: fp32 master weights under autocast, trained by :class:`~verl.utils.amp_optimizer.AmpOptimizer`
      with plain accumulation; megatron's linear layers re-enter autocast in their backward only on CUDA, so the
      backward runs under the forward's autocast here.

    On both, the loss scale exists only in fp16 (megatron-core reports a constant 1.0 otherwise), and checkpoints
    hold the whole weights of the module inside the DDP wrapper.

    Args:
        model: the GPTModel as trained (inside megatron-core's DDP wrapper on the GPU path).
        use_megatron_schedule: the GPU path.
        params_in_compute_dtype: the parameters already are fp16/bf16 (the GPU path, trained or frozen); None
            follows ``use_megatron_schedule``.
        min_loss_scale: the fp16 scaler's floor (``optim.min_loss_scale``), which megatron-core's optimizer does
            not expose.
        hf_config: the Hugging Face config the model was built from; a tensor-parallel checkpoint then also
            exports Hugging Face weights.
    """

    name = "megatron"

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        use_megatron_schedule: bool = False,
        params_in_compute_dtype: bool | None = None,
        min_loss_scale: float | None = None,
        hf_config: Any = None,
    ):
        self.model = model
        self.hf_config = hf_config
        self.use_megatron_schedule = use_megatron_schedule
        self.params_in_compute_dtype = (
            use_megatron_schedule if params_in_compute_dtype is None else params_in_compute_dtype
        )
        self.configured_min_loss_scale = min_loss_scale
        self.fire_drill_target = "loss" if use_megatron_schedule else "gradients"

    def autocast(self, loop):
        if self.params_in_compute_dtype:
            return contextlib.nullcontext()
        return autocast_on(parameter_device_type(loop), loop.dtype)

    def lockstep(self):
        # tensor-parallel ranks and pipeline stages take the same rows, hence the same micro-batches; data-parallel
        # replicas reduce their gradients once per step
        return None

    def holds_a_copy_of_rows(self):
        if not self.split_over_ranks():
            return False
        from verl.models.mcore.parallel import answers_for_its_rows

        return not answers_for_its_rows()  # the rank that returns the group's results counts its rows too

    def backward_mini_batch(self, loop, mini, temperature):
        if self.use_megatron_schedule:
            return self._backward_with_megatron_schedule(loop, mini, temperature)
        if getattr(loop, "stage", None) is not None:  # a model in pipeline stages
            with self.autocast(loop):
                return self._backward_through_stages(loop, mini, temperature)
        # On CPU, megatron's custom_bwd would multiply fp16 output gradients by fp32 weights; under the forward's
        # autocast the backward does what custom_bwd does on CUDA (autograd casts the weight grads to fp32).
        with self.autocast(loop):
            return accumulate_micro_batches(loop, mini, temperature)

    def step(self, loop):
        """megatron-core's ``step()``, refused on the GPU path when bf16/fp32 gradients are not finite.

        With a loss scaler (fp16) megatron-core checks the gradients itself and reports ``(False, None, None)``.
        Without one (bf16, fp32) it clips and applies non-finite gradients and reports success with a NaN norm,
        so the weights would be lost before the handler could decide. Here the check comes first: a non-finite
        gradient skips the step and reports ``(False, nan, None)``, as the CPU path does.
        """
        if self.use_megatron_schedule and loop.dtype != torch.float16 and not _main_grads_are_finite(self.model):
            return False, float("nan"), None
        return loop.optimizer.step()

    def loss_scale(self, loop):
        if loop.dtype != torch.float16:
            return None  # no dynamic scaling outside fp16, whatever the optimizer reports
        return float(loop.optimizer.get_loss_scale())

    def min_loss_scale(self, loop):
        if self.configured_min_loss_scale is not None or self.use_megatron_schedule:
            return self.configured_min_loss_scale
        return getattr(loop.optimizer, "min_loss_scale", None)

    def save_checkpoint(self, loop, directory):
        """Whole weights; a model split over ranks writes per-rank shards and the gathered weights instead (a
        collective, see :mod:`verl.workers.actor.megatron_checkpoint`). With a distributed optimizer every
        data-parallel rank calls this: their shares of the optimizer state are gathered first."""
        from verl.workers.actor.megatron_checkpoint import (
            save_distributed_optimizer_state,
            save_tensor_parallel_checkpoint,
        )

        split = self.split_over_ranks()
        if not save_distributed_optimizer_state(loop, directory, split=split):
            return  # a data-parallel rank other than 0: its share is written
        if not split:
            save_whole_checkpoint(loop, directory, exports=self._export_whole)
            return
        save_tensor_parallel_checkpoint(loop, self.module(), directory, self.hf_config)

    def _export_whole(self, loop, directory, weights):
        """A whole model's ``huggingface/`` export, when ``checkpoint.save_contents`` holds ``hf_model`` (the
        GPTModel's weights under Hugging Face names, LoRA merged)."""
        checkpoint = getattr(loop.config, "checkpoint", None)
        if checkpoint is None or not checkpoint.hf_model or self.hf_config is None:
            return
        from verl.workers.actor.megatron_checkpoint import export_huggingface_weights

        tensors = {key: value for key, value in weights.items() if isinstance(value, torch.Tensor)}
        export_huggingface_weights(directory, tensors, self.hf_config)

    def load_checkpoint(self, loop, directory):
        from verl.workers.actor.megatron_checkpoint import (
            load_distributed_optimizer_state,
            load_tensor_parallel_checkpoint,
        )

        split = self.split_over_ranks()
        if split:
            load_tensor_parallel_checkpoint(loop, self.module(), directory)
        else:
            load_whole_checkpoint(loop, directory)
        load_distributed_optimizer_state(loop, directory, split=split)

    def split_over_ranks(self) -> bool:
        """Whether this rank holds a part of the model (tensor-parallel shards or a pipeline stage)."""
        config = self.module().config
        sizes = (getattr(config, "tensor_model_parallel_size", 1), getattr(config, "pipeline_model_parallel_size", 1))
        return sizes != (1, 1)

    def module(self) -> torch.nn.Module:
        """The GPTModel inside megatron-core's DDP wrapper (the model itself on the CPU path): what is checkpointed."""
        return self.model.module if hasattr(self.model, "module") else self.model

    def _backward_through_stages(self, loop: UpdateLoop, mini: DataProto, temperature) -> list[dict]:
        """The adapter path over pipeline stages: each micro-batch relayed forward through the stages and its
        gradients back (:mod:`verl.models.mcore.pipeline`); the last stage computes the loss and its metrics."""
        from verl.models.mcore.pipeline import stage_backward

        loop.optimizer.zero_grad()
        stage = loop.stage
        all_metrics = []
        micro_batches, _ = split_by_length(mini, loop.micro_batching)
        for micro in micro_batches:
            received, output = loop.run_stage(micro, temperature)
            loss = None
            if stage.is_last:
                loss, metrics = loop._loss_from_model_output(micro, output, temperature)
                loop.note_loss(loss)
                all_metrics.append(metrics)
                loss = loop.optimizer.scale_loss(loss * loop._micro_batch_weight(micro, mini))
            stage_backward(self.model, stage, received, output, loss)
        return all_metrics

    def _backward_with_megatron_schedule(self, loop: UpdateLoop, mini: DataProto, temperature) -> list[dict]:
        """Forward/backward every micro-batch through megatron-core's schedule (pipeline-aware)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.utils import get_model_config

        from verl.models.mcore.fused_head import fused_head_request
        from verl.models.mcore.model import batch_gpt_inputs

        model = self.model
        model.zero_grad_buffer()
        loop.optimizer.zero_grad()
        # by sample count, or by token budget (use_dynamic_bsz) as on the other paths
        micro_batches, _ = split_by_length(mini, loop.micro_batching)
        rows_per_micro_batch = {len(micro) for micro in micro_batches}
        if len(rows_per_micro_batch) > 1:
            # stages exchange activations of one fixed shape unless told the shapes vary (then each send carries it)
            get_model_config(model).variable_seq_lengths = True
        all_metrics: list[dict] = []

        def forward_step(data_iterator, model):
            micro = next(data_iterator)
            batch = micro.batch
            # with use_fused_kernels the output layer computes the log-probs (verl.models.mcore.fused_head)
            request = loop.fused_request(batch, temperature, loop.config.entropy_coeff != 0)
            with fused_head_request(model, request):
                output = model(**batch_gpt_inputs(batch))
            if request is not None:
                output = request.result

            def loss_func(output):
                loss, metrics = loop._loss_from_model_output(micro, output, temperature)
                loop.note_loss(loss)  # before the drill's poison: a drilled NaN travels as a gradient overflow
                loss = loop.fault_injector.poison_loss(loop.num_update_steps + 1, loss)  # this mini-batch's update
                all_metrics.append(metrics)
                # The schedule divides by the number of micro-batches; undo that and weight by the micro-batch's
                # share instead, as the CPU path does.
                return loss * loop._micro_batch_weight(micro, mini) * len(micro_batches), {}

            return output, loss_func

        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micro_batches),
            model=[model],
            num_microbatches=len(micro_batches),
            seq_length=mini.batch["input_ids"].shape[-1],
            micro_batch_size=max(rows_per_micro_batch),
            forward_only=False,
        )
        return all_metrics


def _main_grads_are_finite(model: torch.nn.Module) -> bool:
    """Whether every reduced gradient is finite, agreed over the model-parallel group (one host sync)."""
    grads = [g for p in model.parameters() if (g := getattr(p, "main_grad", p.grad)) is not None]
    if not grads:
        return True
    nonfinite = (~torch.isfinite(torch.stack(torch._foreach_norm(grads)))).any().float().reshape(1)
    if torch.distributed.is_initialized():
        from megatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            # data-parallel ranks already agree (their gradients are reduced); tensor/pipeline ranks hold
            # different shards and must agree too
            group = parallel_state.get_model_parallel_group()
            torch.distributed.all_reduce(nonfinite, op=torch.distributed.ReduceOp.MAX, group=group)
    return nonfinite.item() == 0
