"""Ray workers of the ``megatron`` backend: megatron-core GPTModels initialised from Hugging Face weights.

Which training path runs (megatron-core's optimizer, DDP and schedules on CUDA; the torch.optim adapter on CPU)
is decided by :func:`verl.workers.actor.megatron_builder.build_megatron_actor`, which logs it.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from verl.workers.actor.megatron_actor import MegatronPPOActor
from verl.workers.base_worker import ActorRolloutRefWorker

logger = logging.getLogger(__name__)


class MegatronActorRolloutRefWorker(ActorRolloutRefWorker):
    """Actor, rollout and reference over a megatron-core GPTModel."""

    def _build_actor(self, actor_config: DictConfig, device: str, trainable: bool) -> MegatronPPOActor:
        from verl.models.loading import load_hf_causal_lm
        from verl.workers.actor.megatron_builder import build_megatron_actor

        hf_model = load_hf_causal_lm(self.config.actor_rollout_ref.model.path, dtype=torch.float32, device="cpu")
        actor = build_megatron_actor(
            hf_model.config,
            actor_config,
            device=device,
            total_training_steps=self.total_training_steps,
            hf_state_dict=hf_model.state_dict(),
            rank=self.rank,
            process_group=dist.group.WORLD if dist.is_initialized() else None,
        )
        if not trainable:
            actor.model_module().eval().requires_grad_(False)
        return actor
