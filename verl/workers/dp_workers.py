"""Ray workers of the ``dp`` backend: Hugging Face models in plain PyTorch, data parallel over torch.distributed."""

from __future__ import annotations

import torch

from verl.workers.actor.dp_actor import DataParallelPPOActor, build_dp_actor
from verl.workers.base_worker import ActorRolloutRefWorker, CriticWorker, _process_group
from verl.workers.config import ActorConfig, CriticConfig


class DPActorRolloutRefWorker(ActorRolloutRefWorker):
    """Actor, rollout and reference over a Hugging Face causal LM."""

    def _build_actor(self, actor_config: ActorConfig, device: str, trainable: bool) -> DataParallelPPOActor:
        from verl.models.loading import load_hf_causal_lm

        module = load_hf_causal_lm(self.config.actor_rollout_ref.model.path, dtype=torch.float32, device=device)
        return build_dp_actor(
            actor_config,
            module,
            total_training_steps=self.total_training_steps,
            trainable=trainable,
            rank=self.rank,
            process_group=_process_group(),
        )


class DPCriticWorker(CriticWorker):
    """The critic as a Hugging Face backbone with a value head."""

    def _build_critic(self, critic_config: CriticConfig, device: str):
        from verl.workers.critic.dp_critic import build_dp_critic

        return build_dp_critic(
            self.config.actor_rollout_ref.model.path,
            critic_config,
            total_training_steps=self.total_training_steps,
            rank=self.rank,
            process_group=_process_group(),
            device=device,
        )
