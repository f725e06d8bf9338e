"""What the megatron actor and critic share: a megatron-core GPTModel under the update loop.

Three things differ from a plain PyTorch model, for both roles alike: the module to checkpoint sits inside
megatron-core's DDP wrapper on the GPU path; the dynamic loss scale exists only in fp16 (megatron-core reports a
constant 1.0 otherwise); and on CPU the backward must run under the forward's autocast (see
:meth:`MegatronModelMixin._backward_mini_batch`).
"""

from __future__ import annotations

import torch

from verl.protocol import DataProto


class MegatronModelMixin:
    """Mixed into :class:`~verl.workers.actor.update_loop.UpdateLoop` subclasses that hold ``self.model``."""

    model: torch.nn.Module
    # True when megatron-core's optimizer, DDP and schedule train the model (the GPU path)
    use_megatron_schedule: bool = False

    def model_module(self) -> torch.nn.Module:
        return self.model.module if hasattr(self.model, "module") else self.model

    def _current_loss_scale(self) -> float | None:
        if self.dtype != torch.float16:
            return None  # no dynamic scaling outside fp16, whatever the optimizer reports
        return float(self.optimizer.get_loss_scale())

    def _backward_mini_batch(self, mini: DataProto, temperature: float) -> list[dict[str, float]]:
        # megatron's linear layers re-enter autocast in their backward only on CUDA (custom_bwd with
        # device_type="cuda"); on CPU they would multiply fp16 output gradients by fp32 weights. Running the backward
        # under the forward's autocast does on CPU what custom_bwd does on CUDA; autograd casts weight grads to fp32.
        with self.autocast():
            return super()._backward_mini_batch(mini, temperature)
