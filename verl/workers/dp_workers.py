"""Ray workers of the ``dp`` backend: Hugging Face models in plain PyTorch, data parallel over torch.distributed."""

from __future__ import annotations

import torch

from verl.utils.cpu_linear import use_onednn_linear
from verl.workers.actor.dp_actor import DataParallelPPOActor, build_dp_actor
from verl.workers.base_worker import ActorRolloutRefWorker, CriticWorker, _process_group
from verl.workers.config import ActorConfig, CriticConfig, ModelConfig


def enable_gradient_checkpointing(module: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass (a Hugging Face model's own mechanism)."""
    # non-reentrant checkpointing: correct with inputs that need no gradient and under autocast
    module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def build_dp_policy(
    model_config: ModelConfig,
    actor_config: ActorConfig,
    device: str,
    *,
    trainable: bool,
    total_training_steps: int,
    rank: int,
) -> DataParallelPPOActor:
    """The policy over ``model_config`` (``actor_rollout_ref.model``: a Hugging Face causal LM in fp32 on
    ``device``): trainable (LoRA adapters and gradient checkpointing as configured), or frozen without optimizer (a
    reference, a rollout worker's copy)."""
    from verl.models.loading import load_hf_causal_lm

    module = load_hf_causal_lm(
        model_config.path,
        dtype=torch.float32,
        device=device,
        trust_remote_code=model_config.trust_remote_code,
        config_overrides=model_config.override_config,
    )
    if model_config.use_onednn_linear:
        use_onednn_linear(module, device)
    peft_model = None
    if trainable and model_config.uses_lora:
        from verl.utils.lora import add_lora_adapters

        peft_model = add_lora_adapters(module, model_config)  # in place; freezes the base weights
    if trainable and model_config.enable_gradient_checkpointing:
        enable_gradient_checkpointing(module)
    actor = build_dp_actor(
        actor_config,
        module,
        total_training_steps=total_training_steps,
        trainable=trainable,
        rank=rank,
        process_group=_process_group(),
        use_remove_padding=model_config.use_remove_padding,
    )
    actor.peft_model = peft_model
    return actor


class DPActorRolloutRefWorker(ActorRolloutRefWorker):
    """Actor, rollout and reference over a Hugging Face causal LM."""

    def _build_actor(self, actor_config: ActorConfig, device: str, trainable: bool) -> DataParallelPPOActor:
        return build_dp_policy(
            self.config.model,
            actor_config,
            device,
            trainable=trainable,
            total_training_steps=self.total_training_steps,
            rank=self.rank,
        )


class DPCriticWorker(CriticWorker):
    """The critic as a Hugging Face backbone with a value head."""

    def _build_critic(self, critic_config: CriticConfig, device: str):
        from verl.workers.critic.dp_critic import build_dp_critic

        critic = build_dp_critic(
            critic_config.model.path,
            critic_config,
            total_training_steps=self.total_training_steps,
            rank=self.rank,
            process_group=_process_group(),
            device=device,
        )
        if critic_config.model.enable_gradient_checkpointing:
            enable_gradient_checkpointing(critic.critic_module.backbone)
        critic.critic_module.use_remove_padding = critic_config.model.use_remove_padding
        return critic
