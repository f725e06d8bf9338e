"""The ``megatron`` backend's critic: a megatron-core GPTModel whose output layer is a one-wide value head.

The model is the actor's GPTModel (same builder, same Hugging Face weights); after the weights are loaded its
``output_layer`` (vocabulary-wide, or tied to the embedding) is replaced by :class:`MegatronValueHead`, a
``Linear(hidden, 1)`` with the call signature GPTModel uses for its output layer, so the model's forward returns
(B, S, 1) values where it returned logits. Training runs the torch.optim adapter
(:class:`~verl.utils.amp_optimizer.AmpOptimizer`, fp32 master weights under autocast) under the shared critic loop
and step contract, on the CPU path of :class:`~verl.workers.actor.backend.MegatronBackend`, on CPU and on one GPU
per data-parallel rank. megatron-core's own optimizer, DDP and schedules
are not wired up for the critic yet: asking for them (``critic.megatron.use_megatron_optimizer: true``) is a
``ValueError`` that says so, and ``auto`` on CUDA falls back to the adapter with a warning.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl.models.mcore import build_gpt_model, forward_logits, load_hf_weights_into_mcore
from verl.utils.amp_optimizer import build_amp_optimizer
from verl.workers.actor.backend import MegatronBackend
from verl.workers.actor.update_loop import TORCH_DTYPES, build_loop_parts
from verl.workers.config import CriticConfig
from verl.workers.critic.base import DEFAULT_HEAD_INIT_STD, BasePPOCritic, init_value_head_

logger = logging.getLogger(__name__)


class MegatronValueHead(torch.nn.Linear):
    """``Linear(hidden, 1)`` callable like megatron's output layer: ``(hidden, weight=, runtime_gather_output=)``.

    GPTModel passes its tied embedding as ``weight`` and asks for gathered outputs; a value head has its own
    weight and one output column, so both are ignored. Hidden states are not sequence-parallel here.
    """

    sequence_parallel = False

    def __init__(self, hidden_size: int, *, head_init_std: float = DEFAULT_HEAD_INIT_STD, seed: int = 1):
        super().__init__(hidden_size, 1)
        init_value_head_(self, seed=seed, std=head_init_std)

    def forward(self, hidden_states, weight=None, runtime_gather_output=None):
        """(S, B, H) -> ((S, B, 1) values, None), the (output, bias) pair megatron's linears return."""
        return super().forward(hidden_states), None


def attach_value_head(model: torch.nn.Module, *, head_init_std: float = DEFAULT_HEAD_INIT_STD, seed: int = 1):
    """Replace a GPTModel's output layer by a :class:`MegatronValueHead` (in place; returns the model)."""
    inner = model.module if hasattr(model, "module") else model
    if not getattr(inner, "post_process", False):
        raise ValueError("the megatron critic needs the last pipeline stage (pipeline_model_parallel_size=1).")
    reference = next(inner.parameters())
    head = MegatronValueHead(inner.config.hidden_size, head_init_std=head_init_std, seed=seed)
    inner.output_layer = head.to(device=reference.device, dtype=reference.dtype)
    # the head has its own weight: the embedding must no longer be passed to (or tied with) the output layer
    inner.share_embeddings_and_output_weights = False
    return model


class MegatronPPOCritic(BasePPOCritic):
    """PPO critic over a megatron-core GPTModel with a value head (see :func:`attach_value_head`), on the CPU path
    of :class:`~verl.workers.actor.backend.MegatronBackend` (the adapter optimizer, on any device).

    Args:
        config: the ``critic`` config.
        model: the GPTModel.
        optimizer: an :class:`~verl.utils.amp_optimizer.AmpOptimizer` over its parameters.
        lr_scheduler: its LR schedule.
        **loop_parts: ``update_outcome_handler``, ``fault_injector``, ``rank``.
    """

    def __init__(
        self, config: CriticConfig, model: torch.nn.Module, optimizer: Any, lr_scheduler: Any = None, **loop_parts
    ):
        self.model = model
        super().__init__(config, optimizer, lr_scheduler, backend=MegatronBackend(model), **loop_parts)

    def model_module(self) -> torch.nn.Module:
        return self.backend.module()

    def _forward_values(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        return forward_logits(self.model, input_ids, attention_mask, position_ids)[..., 0]


def build_megatron_critic(
    hf_config: Any,
    critic_config: CriticConfig,
    *,
    total_training_steps: int,
    hf_state_dict: dict[str, torch.Tensor] | None = None,
    device: str | torch.device = "cpu",
    rank: int = 0,
    process_group: Any = None,
) -> MegatronPPOCritic:
    """A ready ``megatron`` critic: GPTModel + value head, AdamW adapter (fp16 loss scaling per ``critic.dtype``).

    Args:
        hf_config: the Hugging Face config of the LM the critic starts from (Llama / Qwen2).
        critic_config: the ``critic`` config, ``ppo_mini_batch_size`` in samples per rank.
        total_training_steps: length of the LR schedule.
        hf_state_dict: the LM's weights (``*ForCausalLM`` state dict); None keeps a fresh initialisation.
        device: where the model lives.
        rank: data-parallel rank.
        process_group: the data-parallel group gradients are averaged over (None: the default group, if any).

    Raises:
        ValueError: a parallel layout or ``use_megatron_optimizer`` value the critic cannot train (see module doc).
    """
    device = torch.device(device)
    dtype = TORCH_DTYPES[critic_config.dtype]
    # the one chooser of the training path, told that the critic has no megatron-core optimizer path yet
    megatron = critic_config.megatron
    if megatron.is_model_parallel:
        raise ValueError(
            f"{CriticConfig.KEY}.megatron: tensor/pipeline parallel sizes {megatron.tensor_model_parallel_size}/"
            f"{megatron.pipeline_model_parallel_size}: the megatron critic is not split over ranks yet; set both to 1 "
            "and scale it out with data parallelism (trainer.n_gpus_per_node)."
        )
    megatron.check_device(device.type, f"{CriticConfig.KEY}.megatron")
    megatron.training_path(device.type, f"{CriticConfig.KEY}.megatron", has_megatron_optimizer_path=False)
    overrides = megatron.transformer_overrides(device.type)
    model = build_gpt_model(hf_config, torch.float32, device, seed=megatron.seed, **overrides)
    if megatron.use_dist_checkpointing:
        from verl.models.mcore.dist_checkpoint import load_dist_checkpoint

        # the LM's checkpoint: its head is skipped, the value head below replaces it
        path, prefix = megatron.dist_checkpointing_path, megatron.dist_checkpointing_prefix
        load_dist_checkpoint(model, path, prefix=prefix, is_value_model=True)
    elif hf_state_dict is not None:
        load_hf_weights_into_mcore(model, hf_state_dict, hf_config)
    attach_value_head(model, seed=critic_config.seed)
    optimizer, scheduler = build_amp_optimizer(
        model.parameters(),
        critic_config.optim,
        dtype=dtype,
        total_training_steps=total_training_steps,
        process_group=process_group,
    )
    critic = MegatronPPOCritic(critic_config, model, optimizer, scheduler, **build_loop_parts(critic_config, rank=rank))
    critic.training_path = f"float32 master weights, {dtype} compute, torch.optim adapter on {device}"
    if megatron.use_dist_checkpointing:
        critic.training_path += f", initial weights from {megatron.dist_checkpointing_path}"
    logger.info("megatron critic: %s", critic.training_path)
    return critic
