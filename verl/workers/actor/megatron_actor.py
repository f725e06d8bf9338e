"""The ``megatron`` backend's actor: a megatron-core GPTModel under the shared loop and step contract.

Two paths, chosen by the device (the worker logs which):

- GPU: the model is wrapped in megatron-core's ``DistributedDataParallel`` with fp16/bf16 parameters, trained by
  ``get_megatron_optimizer`` and ``get_forward_backward_func`` (pipeline size 1 or more). The outcome comes from the
  optimizer's own ``step() -> (update_successful, grad_norm, num_zeros_in_grad)`` and ``get_loss_scale()``.
- CPU (development and CI): the same GPTModel with fp32 master weights under autocast, trained by
  :class:`~verl.utils.amp_optimizer.AmpOptimizer`, which honours the same contract. megatron-core's optimizer, DDP
  and schedules are CUDA-only and are not patched.

Either way a failed update goes to the handler from ``update_failure_policy``, never to a ``NotImplementedError``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from verl.models.mcore import build_attention_mask, forward_logits
from verl.models.mcore.inference import MegatronCachedDecoder
from verl.protocol import DataProto
from verl.utils.torch_functional import compute_response_log_probs
from verl.workers.actor.base import BasePPOActor
from verl.workers.actor.megatron_mixin import MegatronModelMixin
from verl.workers.config import ActorConfig


class MegatronPPOActor(MegatronModelMixin, BasePPOActor):
    """PPO actor over a megatron-core GPTModel.

    Args:
        config: the ``actor_rollout_ref.actor`` config.
        model: the GPTModel (wrapped in megatron-core DDP on the GPU path).
        optimizer: megatron-core's optimizer (GPU path), an AmpOptimizer (CPU path), or None (frozen reference).
        lr_scheduler: LR schedule over the optimizer's param groups.
        use_megatron_schedule: True on the GPU path (megatron-core optimizer, DDP and micro-batch schedule).
        params_in_compute_dtype: the parameters already are fp16/bf16 (the GPU path, trained or frozen), so no
            autocast is needed.
        min_loss_scale: the fp16 loss scaler's floor (``optim.min_loss_scale``); megatron-core's optimizer does
            not expose it, and the update-failure handler needs it to tell a back-off from a stuck scaler.
        **loop_parts: ``update_outcome_handler``, ``fault_injector``, ``rank``.
    """

    def __init__(
        self,
        config: ActorConfig,
        model: torch.nn.Module,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        *,
        use_megatron_schedule: bool = False,
        params_in_compute_dtype: bool | None = None,
        min_loss_scale: float | None = None,
        **loop_parts,
    ):
        self.model = model
        self.use_megatron_schedule = use_megatron_schedule
        self.params_in_compute_dtype = (
            use_megatron_schedule if params_in_compute_dtype is None else params_in_compute_dtype
        )
        self.min_loss_scale = min_loss_scale
        self.training_path = "GPU path" if use_megatron_schedule else "CPU path"
        super().__init__(config, optimizer, lr_scheduler, **loop_parts)

    @property
    def fire_drill_poisons_loss(self) -> bool:
        return self.use_megatron_schedule  # megatron-core's DDP reduces the gradients inside the schedule

    def forward_logits(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        return forward_logits(self.model, input_ids, attention_mask, position_ids)

    def incremental_decoder(self) -> MegatronCachedDecoder:
        """megatron-core's static inference context as the key/value cache, keys in the compute dtype."""
        return MegatronCachedDecoder(self.model, kv_dtype=self.dtype, autocast=self.autocast)

    def autocast(self):
        # On the GPU path the parameters already are fp16/bf16 (megatron keeps fp32 main copies in the optimizer).
        return contextlib.nullcontext() if self.params_in_compute_dtype else super().autocast()

    def _min_loss_scale(self) -> float | None:
        if self.min_loss_scale is not None or self.use_megatron_schedule:
            return self.min_loss_scale  # megatron-core's scaler floor, from the same config
        return super()._min_loss_scale()

    def _step_optimizer(self) -> tuple[bool, float | None, int | None]:
        """megatron-core's ``step()``, refused when bf16/fp32 gradients are not finite.

        With a loss scaler (fp16) megatron-core checks the gradients itself and reports ``(False, None, None)``.
        Without one (bf16, fp32) it clips and applies non-finite gradients and reports success with a NaN norm,
        so the weights would be lost before the handler could decide. Here the check comes first: a non-finite
        gradient skips the step and reports ``(False, nan, None)``, as the adapter path does.
        """
        if self.use_megatron_schedule and self.dtype != torch.float16 and not self._main_grads_are_finite():
            return False, float("nan"), None
        return self.optimizer.step()

    def _main_grads_are_finite(self) -> bool:
        """Whether every reduced gradient is finite, agreed over the model-parallel group (one host sync)."""
        grads = [g for p in self.model.parameters() if (g := getattr(p, "main_grad", p.grad)) is not None]
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

    def _backward_mini_batch(self, mini: DataProto, temperature: float) -> list[dict[str, float]]:
        if self.use_megatron_schedule:
            return self._backward_with_megatron_schedule(mini, temperature)
        return super()._backward_mini_batch(mini, temperature)

    def _backward_with_megatron_schedule(self, mini: DataProto, temperature: float) -> list[dict[str, float]]:
        """Forward/backward every micro-batch through megatron-core's schedule (pipeline-aware)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        micro_batches = list(mini.split(self.micro_batch_size))
        all_metrics: list[dict[str, float]] = []
        response_length = mini.batch["responses"].shape[-1]

        def forward_step(data_iterator, model):
            micro = next(data_iterator)
            batch = micro.batch
            output = model(
                input_ids=batch["input_ids"],
                position_ids=batch["position_ids"],
                attention_mask=build_attention_mask(batch["attention_mask"]),
                runtime_gather_output=True,  # the loss needs the whole vocabulary on every tensor-parallel rank
            )

            def loss_func(logits):
                log_prob, entropy = compute_response_log_probs(
                    logits.float(),
                    batch["input_ids"],
                    response_length,
                    temperature,
                    calculate_entropy=self.config.entropy_coeff != 0,
                )
                loss, metrics = self._loss_from_log_probs(micro, log_prob, entropy)
                loss = self.fault_injector.poison_loss(self.num_update_steps + 1, loss)  # this mini-batch's update
                all_metrics.append(metrics)
                # The schedule divides by the number of micro-batches; undo that and weight by the micro-batch's
                # share instead, as the CPU path does.
                return loss * self._micro_batch_weight(micro, mini) * len(micro_batches), {}

            return output, loss_func

        seq_length = mini.batch["input_ids"].shape[-1]
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micro_batches),
            model=[self.model],
            num_microbatches=len(micro_batches),
            seq_length=seq_length,
            micro_batch_size=self.micro_batch_size,
            forward_only=False,
        )
        return all_metrics
