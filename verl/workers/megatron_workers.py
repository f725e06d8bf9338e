"""Ray workers of the ``megatron`` backend: megatron-core GPTModels initialised from Hugging Face weights.

Which training path runs (megatron-core's optimizer, DDP and schedules on CUDA; the torch.optim adapter on CPU)
is decided by :meth:`verl.workers.config.MegatronConfig.training_path`; the builders log it. A rollout with its own
copy of the weights (``vllm``) gets them through the megatron -> Hugging Face converter, layer by layer.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from verl.workers.actor.megatron_actor import MegatronPPOActor
from verl.workers.base_worker import ActorRolloutRefWorker, CriticWorker, _process_group
from verl.workers.config import ActorConfig, CriticConfig


def _load_hf(path: str):
    from verl.models.loading import load_hf_causal_lm

    return load_hf_causal_lm(path, dtype=torch.float32, device="cpu")


class MegatronActorRolloutRefWorker(ActorRolloutRefWorker):
    """Actor, rollout and reference over a megatron-core GPTModel."""

    def _build_actor(self, actor_config: ActorConfig, device: str, trainable: bool) -> MegatronPPOActor:
        from verl.workers.actor.megatron_builder import build_megatron_actor

        hf_model = _load_hf(self.config.actor_rollout_ref.model.path)
        return build_megatron_actor(
            hf_model.config,
            actor_config,
            device=device,
            total_training_steps=self.total_training_steps,
            hf_state_dict=hf_model.state_dict(),
            trainable=trainable,
            rank=self.rank,
            process_group=_process_group(),
        )

    def _iter_hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The GPTModel's weights under Hugging Face names, converted one layer at a time (fused q/k/v and
        gate/up split back), for a rollout that holds its own copy."""
        from verl.models.loading import load_hf_config
        from verl.models.mcore.weight_converter import iter_hf_weights

        if getattr(self, "_hf_config", None) is None:
            self._hf_config = load_hf_config(self.config.actor_rollout_ref.model.path)
        return iter_hf_weights(self.actor.model_module(), self._hf_config)


class MegatronCriticWorker(CriticWorker):
    """The critic as a megatron-core GPTModel with a value head."""

    def _build_critic(self, critic_config: CriticConfig, device: str):
        from verl.workers.critic.megatron_critic import build_megatron_critic

        hf_model = _load_hf(critic_config.model.path)
        return build_megatron_critic(
            hf_model.config,
            critic_config,
            total_training_steps=self.total_training_steps,
            hf_state_dict=hf_model.state_dict(),
            device=device,
            rank=self.rank,
            process_group=_process_group(),
        )
