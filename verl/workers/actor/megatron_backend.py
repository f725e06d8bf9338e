"""megatron-core's three training paths, each a backend of its own, chosen once when the model is built.

- :class:`MegatronScheduleBackend` (GPU): fp16/bf16 parameters in megatron-core's DDP, its optimizer and its
  forward/backward schedule (pipeline-aware), which reduces the gradients inside the backward, so the fire drill
  poisons the losses; no autocast (the parameters already are in the compute dtype); outside fp16 megatron-core would
  apply non-finite gradients, so the step checks them first; its optimizer does not expose the loss scale's floor,
  which comes from the config instead; with a distributed optimizer its sharded state travels with checkpoints.
- :class:`MegatronStagesBackend` (the torch.optim adapter over pipeline stages): each micro-batch relayed forward
  through the stages and its gradients back (:mod:`verl.models.mcore.pipeline`), under autocast.
- :class:`MegatronBackend` (the torch.optim adapter on a whole model, CPU and GPU): fp32 master weights under
  autocast, plain accumulation; megatron's linear layers re-enter autocast in their backward only on CUDA, so the
  backward runs under the forward's autocast here.

On all three the loss scale exists only in fp16 (megatron-core reports a constant 1.0 otherwise), and checkpoints
hold the whole weights of the module inside the DDP wrapper, or per-rank shards of a model split over ranks
(:mod:`verl.workers.actor.megatron_checkpoint`). :func:`megatron_backend` picks the class.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from verl.utils.micro_batching import split_by_length
from verl.workers.actor.backend import (
    CheckpointContents,
    FireDrillTarget,
    MiniBatchLoss,
    TrainingBackend,
    accumulate_micro_batches,
    attached,
    autocast_on,
    load_whole_checkpoint,
    parameter_device_type,
    save_whole_checkpoint,
)

#: ``(micro, temperature) -> (hidden states received, output)``: a model's own stage of the forward pass.
RunStage = Callable[[Any, Any], tuple[Any, Any]]
#: ``(batch, temperature) -> request or None``: what the fused output layer computes in a scheduled forward pass.
FusedRequest = Callable[[Any, Any], Any]


def megatron_backend(
    model: torch.nn.Module,
    *,
    use_megatron_schedule: bool,
    stage: Any = None,
    run_stage: RunStage | None = None,
    fused_request: FusedRequest | None = None,
    params_in_compute_dtype: bool | None = None,
    min_loss_scale: float | None = None,
    use_distributed_optimizer: bool = False,
    hf_config: Any = None,
) -> TrainingBackend:
    """The backend of one of megatron's paths: megatron-core's schedule (``use_megatron_schedule``), the adapter
    over pipeline stages (``stage`` is this rank's :class:`~verl.models.mcore.pipeline.PipelineStage`), or the
    adapter on a whole model (also a frozen one, whose parameters may already be in the compute dtype). See the
    classes for the arguments."""
    if use_megatron_schedule:
        return MegatronScheduleBackend(
            model,
            fused_request=fused_request,
            min_loss_scale=min_loss_scale,
            use_distributed_optimizer=use_distributed_optimizer,
            hf_config=hf_config,
        )
    if stage is not None and not params_in_compute_dtype:  # a frozen reference never runs the backward
        assert run_stage is not None, "a model in pipeline stages needs its run_stage"
        return MegatronStagesBackend(model, stage, run_stage, min_loss_scale=min_loss_scale, hf_config=hf_config)
    return MegatronBackend(
        model, params_in_compute_dtype=bool(params_in_compute_dtype), min_loss_scale=min_loss_scale, hf_config=hf_config
    )


# ---------------------------------------------------------------------- what the three paths share


def inner_module(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside megatron-core's DDP wrapper (the model itself on the adapter paths): what is
    checkpointed."""
    return model.module if hasattr(model, "module") else model


def split_over_ranks(model: torch.nn.Module) -> bool:
    """Whether this rank holds a part of the model (tensor-parallel shards or a pipeline stage)."""
    config = inner_module(model).config
    sizes = (getattr(config, "tensor_model_parallel_size", 1), getattr(config, "pipeline_model_parallel_size", 1))
    return sizes != (1, 1)


def holds_a_copy_of_rows(model: torch.nn.Module) -> bool:
    """Whether another rank of this rank's model-parallel group answers for the rows they all take."""
    if not split_over_ranks(model):
        return False
    from verl.models.mcore.parallel import answers_for_its_rows

    return not answers_for_its_rows()  # the rank that returns the group's results counts its rows too


def fp16_loss_scale(backend: TrainingBackend) -> float | None:
    """The optimizer's loss scale in fp16; None otherwise, whatever the optimizer reports."""
    parts = attached(backend)
    if parts.dtype != torch.float16:
        return None
    return float(parts.optimizer.get_loss_scale())


def save_megatron_checkpoint(
    model: torch.nn.Module, directory, contents: CheckpointContents, hf_config: Any, distributed_optimizer: Any = None
) -> None:
    """Whole weights; a model split over ranks writes per-rank shards and the gathered weights instead (a
    collective, see :mod:`verl.workers.actor.megatron_checkpoint`). With a distributed optimizer every
    data-parallel rank calls this: their shares of the optimizer state are gathered first."""
    from verl.workers.actor.megatron_checkpoint import (
        export_huggingface_weights,
        save_distributed_optimizer_state,
        save_tensor_parallel_checkpoint,
    )

    split = split_over_ranks(model)
    with_state = "optimizer" in contents.saved_parts  # checkpoint.save_contents: the optimizer's state or not
    if not save_distributed_optimizer_state(distributed_optimizer, directory, split=split, with_state=with_state):
        return  # a data-parallel rank other than 0: its share is written, or none is asked for
    if split:
        export_config = hf_config if contents.hf_model else None
        save_tensor_parallel_checkpoint(contents.training_state, inner_module(model), directory, export_config)
        return

    def export_whole(directory, contents, weights):
        # a whole model's huggingface/ export when checkpoint.save_contents holds hf_model (LoRA merged)
        if contents.hf_model and hf_config is not None:
            tensors = {key: value for key, value in weights.items() if isinstance(value, torch.Tensor)}
            export_huggingface_weights(directory, tensors, hf_config)

    save_whole_checkpoint(directory, contents, exports=export_whole)


def load_megatron_checkpoint(
    model: torch.nn.Module, directory, contents: CheckpointContents, distributed_optimizer: Any = None
) -> None:
    """Restore what :func:`save_megatron_checkpoint` wrote."""
    from verl.workers.actor.megatron_checkpoint import load_distributed_optimizer_state, load_tensor_parallel_checkpoint

    split = split_over_ranks(model)
    if split:
        load_tensor_parallel_checkpoint(contents.load_training_state, inner_module(model), directory)
    else:
        load_whole_checkpoint(directory, contents)
    if "optimizer" in contents.loaded_parts:  # checkpoint.load_contents: else the optimizer starts fresh
        load_distributed_optimizer_state(distributed_optimizer, directory, split=split)


# ---------------------------------------------------------------------- the backends


class MegatronBackend(TrainingBackend):
    """``megatron`` on the torch.optim adapter (:class:`~verl.utils.amp_optimizer.AmpOptimizer`), a whole model on
    this rank (tensor-parallel shards included): plain accumulation under the forward's autocast.

    Args:
        model: the GPTModel.
        params_in_compute_dtype: the parameters already are fp16/bf16 (a frozen reference next to megatron-core's
            path), so no autocast is needed.
        min_loss_scale: the fp16 scaler's floor (``optim.min_loss_scale``); None reads the optimizer's.
        hf_config: the Hugging Face config the model was built from (a checkpoint then exports Hugging Face weights).
    """

    name = "megatron"
    fire_drill_target = FireDrillTarget.GRADIENTS

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        params_in_compute_dtype: bool = False,
        min_loss_scale: float | None = None,
        hf_config: Any = None,
    ):
        self.model = model
        self.params_in_compute_dtype = params_in_compute_dtype
        self.configured_min_loss_scale = min_loss_scale
        self.hf_config = hf_config

    def autocast(self):
        if self.params_in_compute_dtype:
            return contextlib.nullcontext()
        return autocast_on(parameter_device_type(self.model), attached(self).dtype)

    def lockstep(self):
        # tensor-parallel ranks take the same rows, hence the same micro-batches; data-parallel replicas reduce their
        # gradients once per step
        return None

    def holds_a_copy_of_rows(self):
        return holds_a_copy_of_rows(self.model)

    def backward_mini_batch(self, batch):
        # On CPU, megatron's custom_bwd would multiply fp16 output gradients by fp32 weights; under the forward's
        # autocast the backward does what custom_bwd does on CUDA (autograd casts the weight grads to fp32).
        with self.autocast():
            return accumulate_micro_batches(attached(self), batch, self.lockstep())

    def step(self):
        return attached(self).optimizer.step()

    def loss_scale(self):
        return fp16_loss_scale(self)

    def min_loss_scale(self):
        if self.configured_min_loss_scale is not None:
            return self.configured_min_loss_scale
        return getattr(attached(self).optimizer, "min_loss_scale", None)

    def save_checkpoint(self, directory, contents):
        save_megatron_checkpoint(self.model, directory, contents, self.hf_config)

    def load_checkpoint(self, directory, contents):
        load_megatron_checkpoint(self.model, directory, contents)

    def module(self) -> torch.nn.Module:
        """The GPTModel: what is checkpointed."""
        return inner_module(self.model)


class MegatronStagesBackend(TrainingBackend):
    """``megatron`` on the torch.optim adapter over pipeline stages: each micro-batch relayed forward through the
    stages and its gradients back (:func:`~verl.models.mcore.pipeline.stage_backward`); the last stage computes the
    loss and its metrics.

    Args:
        model: this rank's stage of the GPTModel.
        stage: this rank's :class:`~verl.models.mcore.pipeline.PipelineStage`.
        run_stage: the model's stage of the forward pass, ``(micro, temperature) -> (received, output)``.
        min_loss_scale: the fp16 scaler's floor; None reads the optimizer's.
        hf_config: the Hugging Face config the model was built from (checkpoints export Hugging Face weights).
    """

    name = "megatron"
    fire_drill_target = FireDrillTarget.GRADIENTS

    def __init__(
        self,
        model: torch.nn.Module,
        stage: Any,
        run_stage: RunStage,
        *,
        min_loss_scale: float | None = None,
        hf_config: Any = None,
    ):
        self.model = model
        self.stage = stage
        self.run_stage = run_stage
        self.configured_min_loss_scale = min_loss_scale
        self.hf_config = hf_config

    def autocast(self):
        return autocast_on(parameter_device_type(self.model), attached(self).dtype)

    def lockstep(self):
        return None  # the stages take the same rows, hence the same micro-batches

    def holds_a_copy_of_rows(self):
        return holds_a_copy_of_rows(self.model)

    def backward_mini_batch(self, batch):
        from verl.models.mcore.pipeline import stage_backward

        parts = attached(self)
        parts.optimizer.zero_grad()
        all_metrics = []
        micro_batches, _ = split_by_length(batch.mini, parts.micro_batching)
        with self.autocast():
            for micro in micro_batches:
                received, output = self.run_stage(micro, batch.temperature)
                loss = None
                if self.stage.is_last:
                    loss, metrics = batch.loss_from_output(micro, output)
                    batch.note_loss(loss)
                    all_metrics.append(metrics)
                    loss = parts.optimizer.scale_loss(loss * batch.weight(micro))
                stage_backward(self.model, self.stage, received, output, loss)
        return all_metrics

    def step(self):
        return attached(self).optimizer.step()

    def loss_scale(self):
        return fp16_loss_scale(self)

    def min_loss_scale(self):
        if self.configured_min_loss_scale is not None:
            return self.configured_min_loss_scale
        return getattr(attached(self).optimizer, "min_loss_scale", None)

    def save_checkpoint(self, directory, contents):
        save_megatron_checkpoint(self.model, directory, contents, self.hf_config)

    def load_checkpoint(self, directory, contents):
        load_megatron_checkpoint(self.model, directory, contents)

    def module(self) -> torch.nn.Module:
        """This rank's stage of the GPTModel: what is checkpointed."""
        return inner_module(self.model)


class MegatronScheduleBackend(TrainingBackend):
    """``megatron`` on megatron-core's DDP, optimizer and forward/backward schedule (GPU; see the module doc).

    Args:
        model: the GPTModel inside megatron-core's DDP wrapper.
        fused_request: ``(batch, temperature) -> request or None``: what the fused output layer computes in a
            scheduled forward pass (``model.use_fused_kernels``); None: the model returns logits.
        min_loss_scale: the fp16 scaler's floor (``optim.min_loss_scale``), which megatron-core's optimizer does not
            expose (None outside fp16).
        use_distributed_optimizer: megatron-core's optimizer shards its state over the data-parallel ranks, which
            checkpoints then gather and scatter.
        hf_config: the Hugging Face config the model was built from (checkpoints export Hugging Face weights).
    """

    name = "megatron"
    fire_drill_target = FireDrillTarget.LOSS

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        fused_request: FusedRequest | None = None,
        min_loss_scale: float | None = None,
        use_distributed_optimizer: bool = False,
        hf_config: Any = None,
    ):
        self.model = model
        self.fused_request = fused_request
        self.configured_min_loss_scale = min_loss_scale
        self.use_distributed_optimizer = use_distributed_optimizer
        self.hf_config = hf_config

    def autocast(self):
        return contextlib.nullcontext()  # the parameters already are in the compute dtype

    def lockstep(self):
        return None  # the schedule runs as many micro-batches on every rank of a model-parallel group

    def holds_a_copy_of_rows(self):
        return holds_a_copy_of_rows(self.model)

    def backward_mini_batch(self, batch):
        """Forward/backward every micro-batch through megatron-core's schedule (pipeline-aware)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.utils import get_model_config

        self.model.zero_grad_buffer()
        attached(self).optimizer.zero_grad()
        # by sample count, or by token budget (use_dynamic_bsz) as on the other paths
        micro_batches, _ = split_by_length(batch.mini, attached(self).micro_batching)
        rows_per_micro_batch = {len(micro) for micro in micro_batches}
        if len(rows_per_micro_batch) > 1:
            # stages exchange activations of one fixed shape unless told the shapes vary (then each send carries it)
            get_model_config(self.model).variable_seq_lengths = True
        all_metrics: list[dict] = []
        get_forward_backward_func()(
            forward_step_func=self._forward_step(batch, len(micro_batches), all_metrics),
            data_iterator=iter(micro_batches),
            model=[self.model],
            num_microbatches=len(micro_batches),
            seq_length=batch.mini.batch["input_ids"].shape[-1],
            micro_batch_size=max(rows_per_micro_batch),
            forward_only=False,
        )
        return all_metrics

    def _forward_step(self, batch: MiniBatchLoss, num_micro_batches: int, all_metrics: list[dict]):
        """The schedule's ``forward_step_func`` over ``batch``'s micro-batches; appends their metrics."""
        from verl.models.mcore.fused_head import fused_head_request
        from verl.models.mcore.model import batch_gpt_inputs

        injector = attached(self).fault_injector

        def forward_step(data_iterator, model):
            micro = next(data_iterator)
            # with use_fused_kernels the output layer computes the log-probs (verl.models.mcore.fused_head)
            request = None if self.fused_request is None else self.fused_request(micro.batch, batch.temperature)
            with fused_head_request(model, request):
                output = model(**batch_gpt_inputs(micro.batch))
            if request is not None:
                output = request.result

            def loss_func(output):
                loss, metrics = batch.loss_from_output(micro, output)
                batch.note_loss(loss)  # before the drill's poison: a drilled NaN travels as a gradient overflow
                loss = injector.poison_loss(batch.update_step, loss)
                all_metrics.append(metrics)
                # The schedule divides by the number of micro-batches; undo that and weight by the micro-batch's
                # share instead, as the adapter paths do.
                return loss * batch.weight(micro) * num_micro_batches, {}

            return output, loss_func

        return forward_step

    def step(self):
        """megatron-core's ``step()``, refused when bf16/fp32 gradients are not finite.

        With a loss scaler (fp16) megatron-core checks the gradients itself and reports ``(False, None, None)``.
        Without one (bf16, fp32) it clips and applies non-finite gradients and reports success with a NaN norm,
        so the weights would be lost before the handler could decide. Here the check comes first: a non-finite
        gradient skips the step and reports ``(False, nan, None)``, as the adapter paths do.
        """
        parts = attached(self)
        if parts.dtype != torch.float16 and not _main_grads_are_finite(self.model):
            return False, float("nan"), None
        return parts.optimizer.step()

    def loss_scale(self):
        return fp16_loss_scale(self)

    def min_loss_scale(self):
        return self.configured_min_loss_scale  # megatron-core's optimizer does not expose it

    def save_checkpoint(self, directory, contents):
        save_megatron_checkpoint(self.model, directory, contents, self.hf_config, self._distributed_optimizer())

    def load_checkpoint(self, directory, contents):
        load_megatron_checkpoint(self.model, directory, contents, self._distributed_optimizer())

    def module(self) -> torch.nn.Module:
        """The GPTModel inside megatron-core's DDP wrapper: what is checkpointed."""
        return inner_module(self.model)

    def _distributed_optimizer(self) -> Any | None:
        from verl.workers.actor.megatron_checkpoint import distributed_optimizer

        return distributed_optimizer(attached(self).optimizer, self.use_distributed_optimizer)


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
