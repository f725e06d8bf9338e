"""The ``dp`` backend's actor: a Hugging Face causal LM (or any module returning logits) in plain PyTorch.

Data parallelism is the optimizer's business (:class:`verl.utils.amp_optimizer.AmpOptimizer` averages gradients
over the process group before it checks them), so this class only says how to run the model forward and which
backend trains it (:class:`~verl.workers.actor.backend.DPBackend`); the loop, the losses and the optimizer-step
contract live in :class:`~verl.workers.actor.update_loop.UpdateLoop` and :class:`~verl.workers.actor.base.BasePPOActor`.
:func:`build_dp_actor` is what a worker calls.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import PreTrainedModel

from verl.models.llama_decode import LlamaFamilyDecoder, supports_llama_decode
from verl.utils.amp_optimizer import build_amp_optimizer
from verl.utils.padding_free import forward_packed
from verl.workers.actor.backend import DPBackend, TrainingBackend
from verl.workers.actor.base import BasePPOActor
from verl.workers.actor.update_loop import TORCH_DTYPES, build_loop_parts
from verl.workers.config import ActorConfig
from verl.workers.rollout.decoding import HFCachedDecoder, IncrementalDecoder

logger = logging.getLogger(__name__)


class DataParallelPPOActor(BasePPOActor):
    """PPO actor over a ``torch.nn.Module``.

    Args:
        config: the ``actor_rollout_ref.actor`` config (per-rank mini-batch size in samples).
        actor_module: a module called as ``module(input_ids=, attention_mask=, position_ids=)`` returning logits
            (B, S, V) or an object with ``.logits`` (Hugging Face models).
        optimizer: an :class:`~verl.utils.amp_optimizer.AmpOptimizer` over the module's parameters (None: frozen).
        lr_scheduler: its LR schedule.
        use_remove_padding: run forward passes on the packed real tokens (``model.use_remove_padding``; see
            :mod:`verl.utils.padding_free`).
        backend: the training backend (default :class:`~verl.workers.actor.backend.DPBackend`; the FSDP2 actor
            passes its :class:`~verl.workers.actor.backend.FSDPBackend`).
        **loop_parts: ``update_outcome_handler``, ``fault_injector``, ``rank`` (see :func:`build_loop_parts`).
    """

    def __init__(
        self,
        config: ActorConfig,
        actor_module: torch.nn.Module,
        optimizer=None,
        lr_scheduler=None,
        use_remove_padding: bool = False,
        backend: TrainingBackend | None = None,
        **loop_parts,
    ):
        self.actor_module = actor_module
        self.use_remove_padding = use_remove_padding
        backend = DPBackend() if backend is None else backend
        super().__init__(config, optimizer, lr_scheduler, backend=backend, **loop_parts)

    def forward_logits(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        kwargs = {"use_cache": False} if isinstance(self.actor_module, PreTrainedModel) else {}
        if self.use_remove_padding:
            return forward_packed(self.actor_module, input_ids, attention_mask, position_ids, **kwargs)
        output = self.actor_module(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        )
        return getattr(output, "logits", output)

    def model_module(self) -> torch.nn.Module:
        return self.actor_module

    def incremental_decoder(self) -> IncrementalDecoder:
        """A Hugging Face model decodes on its own key/value cache (Llama-family models on the lean decode step of
        :mod:`verl.models.llama_decode`); any other module re-runs the sequence."""
        if supports_llama_decode(self.actor_module):
            return LlamaFamilyDecoder(self.actor_module, self.autocast)
        if isinstance(self.actor_module, PreTrainedModel):
            return HFCachedDecoder(self.actor_module, self.autocast)
        return super().incremental_decoder()


def build_dp_actor(
    config: ActorConfig,
    module: torch.nn.Module,
    *,
    total_training_steps: int,
    trainable: bool = True,
    rank: int = 0,
    process_group: Any = None,
    use_remove_padding: bool = False,
) -> DataParallelPPOActor:
    """A ready ``dp`` actor over ``module`` (fp32 master weights): AdamW, LR schedule, handler, fire drill.

    ``trainable=False`` gives a frozen reference: no optimizer, no handler, no gradients.
    """
    if not trainable:
        module.eval().requires_grad_(False)
        return DataParallelPPOActor(config, module, rank=rank, use_remove_padding=use_remove_padding)
    dtype = TORCH_DTYPES[config.dtype]
    optimizer, scheduler = build_amp_optimizer(
        module.parameters(),
        config.optim,
        dtype=dtype,
        total_training_steps=total_training_steps,
        process_group=process_group,
    )
    logger.info("dp actor: float32 master weights, %s compute", dtype)
    return DataParallelPPOActor(
        config,
        module,
        optimizer,
        scheduler,
        use_remove_padding=use_remove_padding,
        **build_loop_parts(config, rank=rank),
    )
