"""The ``megatron`` backend's critic: a megatron-core GPTModel whose output layer is a one-wide value head.

The model is the actor's GPTModel (same builder, same Hugging Face weights); after the weights are loaded its
``output_layer`` (vocabulary-wide, or tied to the embedding) is replaced by :class:`MegatronValueHead`, a
``Linear(hidden, 1)`` with the call signature GPTModel uses for its output layer, so the model's forward returns
(B, S, 1) values where it returned logits. Training runs the torch.optim adapter
(:class:`~verl.utils.amp_optimizer.AmpOptimizer`, fp32 master weights under autocast) under the shared critic loop
and step contract, on CPU and on one GPU per data-parallel rank. megatron-core's own optimizer, DDP and schedules
are not wired up for the critic yet: asking for them (``critic.megatron.use_megatron_optimizer: true``) is a
``ValueError`` that says so, and ``auto`` on CUDA falls back to the adapter with a warning.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl.models.mcore import build_gpt_model, forward_logits, load_hf_weights_into_mcore
from verl.utils.amp_optimizer import build_amp_optimizer
from verl.utils.config import cfg_get
from verl.workers.actor.base import resolve_dtype
from verl.workers.critic.base import BasePPOCritic
from verl.workers.critic.dp_critic import DEFAULT_HEAD_INIT_STD

logger = logging.getLogger(__name__)


class MegatronValueHead(torch.nn.Linear):
    """``Linear(hidden, 1)`` callable like megatron's output layer: ``(hidden, weight=, runtime_gather_output=)``.

    GPTModel passes its tied embedding as ``weight`` and asks for gathered outputs; a value head has its own
    weight and one output column, so both are ignored. Hidden states are not sequence-parallel here.
    """

    sequence_parallel = False

    def __init__(self, hidden_size: int, *, head_init_std: float = DEFAULT_HEAD_INIT_STD, seed: int = 1):
        super().__init__(hidden_size, 1)
        generator = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            self.weight.copy_(torch.randn(self.weight.shape, generator=generator) * head_init_std)
            self.bias.zero_()

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
    """PPO critic over a megatron-core GPTModel with a value head (see :func:`attach_value_head`).

    Args:
        config: the ``critic`` config.
        model: the GPTModel.
        optimizer: an :class:`~verl.utils.amp_optimizer.AmpOptimizer` over its parameters.
        lr_scheduler: its LR schedule.
        rank: data-parallel rank.
    """

    def __init__(self, config: Any, model: torch.nn.Module, optimizer: Any, lr_scheduler: Any = None, rank=0):
        self.model = model
        super().__init__(config, optimizer, lr_scheduler, rank=rank)

    def _forward_values(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        return forward_logits(self.model, input_ids, attention_mask, position_ids)[..., 0]

    def _trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _backward_mini_batch(self, mini, temperature: float) -> list[dict[str, float]]:
        # megatron's linears re-enter autocast in their backward only for CUDA (custom_bwd(device_type="cuda")); on
        # CPU their backward would multiply fp16 output gradients by fp32 weights and fail. Running the backward
        # under the forward's autocast is what custom_bwd does on CUDA; autograd casts weight grads back to fp32.
        with self._autocast():
            return super()._backward_mini_batch(mini, temperature)

    def _current_loss_scale(self) -> float | None:
        if self.dtype != torch.float16:
            return None  # no dynamic scaling outside fp16, whatever the optimizer reports
        return float(self.optimizer.get_loss_scale())

    def model_module(self) -> torch.nn.Module:
        return self.model.module if hasattr(self.model, "module") else self.model


def _check_training_path(megatron_config: Any, device: torch.device) -> tuple[int, int]:
    """(tp, pp) after checking that the adapter path can train this configuration."""
    tp = int(cfg_get(megatron_config, "tensor_model_parallel_size", 1) or 1)
    pp = int(cfg_get(megatron_config, "pipeline_model_parallel_size", 1) or 1)
    use_megatron = cfg_get(megatron_config, "use_megatron_optimizer", "auto")
    if use_megatron not in ("auto", True, False):
        raise ValueError(f"critic.megatron.use_megatron_optimizer must be auto, true or false, got {use_megatron!r}.")
    if use_megatron is True:
        raise ValueError(
            "critic.megatron.use_megatron_optimizer=true: the megatron critic's GPU path (megatron-core optimizer, "
            "DDP and schedules) is not available yet. Set critic.megatron.use_megatron_optimizer=false (or auto) to "
            "train the megatron critic with the torch.optim adapter, or use critic.strategy=dp."
        )
    if use_megatron == "auto" and device.type == "cuda":
        logger.warning(
            "megatron critic: megatron-core's optimizer path is not available for the critic yet; training it with "
            "the torch.optim adapter (fp32 master weights, autocast) on %s.",
            device,
        )
    if (tp, pp) != (1, 1):
        raise ValueError(
            f"critic.megatron: tensor/pipeline parallel sizes {tp}/{pp} need megatron-core's optimizer path, which "
            "the critic does not have yet; set both to 1 for the critic (the actor may still use more)."
        )
    return tp, pp


def build_megatron_critic(
    hf_config: Any,
    critic_config: Any,
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
        ValueError: an unsupported dtype, parallel layout or ``use_megatron_optimizer`` value (see module doc).
    """
    device = torch.device(device)
    dtype = resolve_dtype(cfg_get(critic_config, "dtype", "float32"), "critic.dtype")
    tp, pp = _check_training_path(cfg_get(critic_config, "megatron"), device)
    seed = int(cfg_get(critic_config, "seed", 1))
    model = build_gpt_model(
        hf_config, torch.float32, device, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, seed=seed
    )
    if hf_state_dict is not None:
        load_hf_weights_into_mcore(model, hf_state_dict, hf_config)
    attach_value_head(model, seed=seed)
    optimizer, scheduler = build_amp_optimizer(
        model.parameters(),
        cfg_get(critic_config, "optim"),
        dtype=dtype,
        total_training_steps=total_training_steps,
        process_group=process_group,
    )
    logger.info("megatron critic: float32 master weights, %s compute, torch.optim adapter on %s", dtype, device)
    return MegatronPPOCritic(critic_config, model, optimizer, scheduler, rank=rank)
