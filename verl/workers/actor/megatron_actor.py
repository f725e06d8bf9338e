"""The ``megatron`` backend's actor: a megatron-core GPTModel under the shared loop and step contract.

Two paths, chosen by the device (the worker logs which):

- GPU: the model is wrapped in megatron-core's ``DistributedDataParallel`` with fp16/bf16 parameters, trained by
  ``get_megatron_optimizer`` and ``get_forward_backward_func`` (pipeline size 1 or more). The outcome comes from the
  optimizer's own ``step() -> (update_successful, grad_norm, num_zeros_in_grad)`` and ``get_loss_scale()``.
- CPU (development and CI): the same GPTModel with fp32 master weights under autocast, trained by
  :class:`~verl.utils.amp_optimizer.AmpOptimizer`, which honours the same contract. megatron-core's optimizer, DDP
  and schedules are CUDA-only and are not patched.

Either way a failed update goes to the handler from ``update_failure_policy``, never to a ``NotImplementedError``.

``actor.use_torch_compile`` compiles what verl compiles on megatron: the entropy of the logits (verl's megatron
engine compiles the reduction inside its vocabulary-parallel entropy), not megatron-core's forward, whose fused
layers and schedules are its own. With ``model.use_fused_kernels`` the output layer computes the entropy instead and
nothing is compiled.

What the paths change in the loop (schedule, autocast, fire drill, step, loss scale) is all in their backends
(:mod:`verl.workers.actor.megatron_backend`: megatron-core's schedule, the adapter over pipeline stages, the plain
adapter), chosen once when the actor is built; this class adds the GPTModel's forward pass and decoder.

With pipeline stages (``megatron.pipeline_model_parallel_size > 1``) every pass runs through the stages of
:mod:`verl.models.mcore.pipeline`: the log-prob pass and the decoder relay the hidden states and hand the last
stage's result to every stage; the adapter path's update relays them forward and the gradients back, a micro-batch
at a time (megatron-core's own schedule does that on the GPU path).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from verl.models.mcore import forward_logits
from verl.models.mcore.fused_head import FusedHeadRequest, fused_head_request, use_fused_head
from verl.models.mcore.inference import MegatronCachedDecoder
from verl.models.mcore.model import batch_gpt_inputs
from verl.models.mcore.pipeline import PipelineStage, broadcast_from_last_stage, stage_forward
from verl.workers.actor.base import BasePPOActor
from verl.workers.actor.megatron_backend import megatron_backend
from verl.workers.config import ActorConfig

logger = logging.getLogger(__name__)


class MegatronPPOActor(BasePPOActor):
    """PPO actor over a megatron-core GPTModel, on one of the backends of :mod:`verl.workers.actor.megatron_backend`.

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
        hf_config: the Hugging Face config of the model (a tensor-parallel checkpoint exports Hugging Face weights).
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
        hf_config: Any = None,
        **loop_parts,
    ):
        self.model = model
        self.training_path = "GPU path" if use_megatron_schedule else "CPU path"
        self.stage = PipelineStage.of_model(model)  # this rank's pipeline stage (None: the whole model is here)
        calculate_entropy = config.entropy_coeff != 0
        # the path is chosen here, once: megatron-core's schedule, the adapter over stages, or the plain adapter
        backend = megatron_backend(
            model,
            use_megatron_schedule=use_megatron_schedule,
            stage=self.stage,
            run_stage=self.run_stage,
            fused_request=lambda batch, temperature: self.fused_request(batch, temperature, calculate_entropy),
            params_in_compute_dtype=use_megatron_schedule
            if params_in_compute_dtype is None
            else params_in_compute_dtype,
            min_loss_scale=min_loss_scale,
            use_distributed_optimizer=config.megatron.use_distributed_optimizer,
            hf_config=hf_config,
        )
        super().__init__(config, optimizer, lr_scheduler, backend=backend, **loop_parts)
        if config.use_fused_kernels and (self.stage is None or self.stage.is_last):
            use_fused_head(model)
        if config.use_torch_compile:
            logger.info(
                "megatron actor: use_torch_compile compiles the entropy of the logits%s",
                " (unused: use_fused_kernels computes it in the output layer)" if config.use_fused_kernels else "",
            )

    def model_module(self) -> torch.nn.Module:
        return self.backend.module()

    def _entropy_options(self) -> dict[str, bool]:
        return {**super()._entropy_options(), "entropy_compiled": self.config.use_torch_compile}

    def forward_logits(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        return forward_logits(self.model, input_ids, attention_mask, position_ids)

    def forward_response_log_probs(
        self, input_ids, attention_mask, position_ids, response_length, temperature, calculate_entropy
    ):
        # the GPTModel's own forward runs; its output layer computes the log-probs chunk by chunk (FusedHeadOutputLayer)
        request = FusedHeadRequest(input_ids, response_length, temperature, calculate_entropy)
        with fused_head_request(self.model, request):
            forward_logits(self.model, input_ids, attention_mask, position_ids)
        return request.result

    def fused_request(self, batch, temperature: float, calculate_entropy: bool) -> FusedHeadRequest | None:
        """What the fused output layer computes for a micro-batch's whole columns (``model.use_fused_kernels``, on
        the rank holding the output layer), or None."""
        if not self.config.use_fused_kernels or (self.stage is not None and not self.stage.is_last):
            return None
        return FusedHeadRequest(batch["input_ids"], batch["responses"].shape[-1], temperature, calculate_entropy)

    def run_stage(self, micro, temperature: float, calculate_entropy: bool | None = None):
        """This rank's stage of the forward pass over a micro-batch's whole columns (see
        :func:`~verl.models.mcore.pipeline.stage_forward`): (the hidden states received, the output), the last
        stage's output being the logits or, with the fused head, the response's (log-probs, entropy) (the entropy
        when ``calculate_entropy``, by default when the loss has an entropy term)."""
        if calculate_entropy is None:
            calculate_entropy = self.config.entropy_coeff != 0
        batch = micro.batch
        request = self.fused_request(batch, temperature, calculate_entropy)
        with fused_head_request(self.model, request):
            received, output = stage_forward(self.model, self.stage, **batch_gpt_inputs(batch))
        return received, output if request is None else request.result

    def _forward_micro_batch(self, micro, temperature, calculate_entropy):
        if self.stage is None:
            return super()._forward_micro_batch(micro, temperature, calculate_entropy)
        with self.autocast():
            _, output = self.run_stage(micro, temperature, calculate_entropy)
        results = [None, None]
        if self.stage.is_last:
            results = list(self._log_probs_from_model_output(micro, output, temperature, calculate_entropy))
        count = 2 if calculate_entropy else 1
        shape = tuple(micro.batch["responses"].shape)
        device = micro.batch["input_ids"].device
        received = broadcast_from_last_stage(self.stage, results[:count], [shape] * count, torch.float32, device)
        return received[0], received[1] if calculate_entropy else None

    def adapters_off(self):
        from verl.models.mcore.lora import adapters_disabled, has_adapters

        module = self.model_module()
        return functools.partial(adapters_disabled, module) if has_adapters(module) else None

    def incremental_decoder(self) -> MegatronCachedDecoder:
        """megatron-core's static inference context as the key/value cache, keys in the compute dtype."""
        return MegatronCachedDecoder(self.model, kv_dtype=self.dtype, autocast=self.autocast)
