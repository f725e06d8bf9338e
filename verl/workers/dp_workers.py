"""Ray workers of the ``dp`` backend: Hugging Face models in plain PyTorch, data parallel over torch.distributed."""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from verl.utils.amp_optimizer import build_amp_optimizer
from verl.workers.actor.base import resolve_dtype
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.base_worker import ActorRolloutRefWorker

logger = logging.getLogger(__name__)


class DPActorRolloutRefWorker(ActorRolloutRefWorker):
    """Actor, rollout and reference over a Hugging Face causal LM."""

    def _build_actor(self, actor_config: DictConfig, device: str, trainable: bool) -> DataParallelPPOActor:
        from verl.models.loading import load_hf_causal_lm

        module = load_hf_causal_lm(self.config.actor_rollout_ref.model.path, dtype=torch.float32, device=device)
        if not trainable:
            module.eval().requires_grad_(False)
            return DataParallelPPOActor(actor_config, module, optimizer=None, rank=self.rank)
        dtype = resolve_dtype(actor_config.dtype, "actor_rollout_ref.actor.dtype")
        optimizer, scheduler = build_amp_optimizer(
            module.parameters(),
            actor_config.optim,
            dtype=dtype,
            total_training_steps=self.total_training_steps,
            process_group=dist.group.WORLD if dist.is_initialized() else None,
        )
        logger.info("dp actor: %s master weights, %s compute, on %s", torch.float32, dtype, device)
        return DataParallelPPOActor(actor_config, module, optimizer, scheduler, rank=self.rank)
