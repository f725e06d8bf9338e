"""The ``dp`` backend's actor: a Hugging Face causal LM (or any module returning logits) in plain PyTorch.

Data parallelism is the optimizer's business (:class:`verl.utils.amp_optimizer.AmpOptimizer` averages gradients
over the process group before it checks them), so this class only says how to run the model forward; the loop,
the losses and the optimizer-step contract live in :class:`verl.workers.actor.base.BasePPOActor`.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from verl.workers.actor.base import BasePPOActor


class DataParallelPPOActor(BasePPOActor):
    """PPO actor over a ``torch.nn.Module``.

    Args:
        config: the ``actor_rollout_ref.actor`` config.
        actor_module: a module called as ``module(input_ids=, attention_mask=, position_ids=)`` returning logits
            (B, S, V) or an object with ``.logits`` (Hugging Face models).
        optimizer: an :class:`~verl.utils.amp_optimizer.AmpOptimizer` over the module's parameters.
        lr_scheduler: its LR schedule.
        rank: data-parallel rank.
    """

    def __init__(self, config: Any, actor_module: torch.nn.Module, optimizer, lr_scheduler=None, rank: int = 0):
        self.actor_module = actor_module
        super().__init__(config, optimizer, lr_scheduler, rank=rank, role="actor")

    def _forward_logits(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        kwargs = {"use_cache": False} if isinstance(self.actor_module, PreTrainedModel) else {}
        output = self.actor_module(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        return getattr(output, "logits", output)

    def model_module(self) -> torch.nn.Module:
        return self.actor_module

    def _trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.actor_module.parameters() if p.requires_grad]
