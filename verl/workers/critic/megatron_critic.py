"""The ``megatron`` backend's critic: a megatron-core GPTModel whose output layer is a one-wide value head.

The model is the actor's GPTModel (same builder, same Hugging Face weights); after the weights are loaded its
``output_layer`` (vocabulary-wide, or tied to the embedding) is replaced by :class:`MegatronValueHead`, a
``Linear(hidden, 1)`` with the call signature GPTModel uses for its output layer, so the model's forward returns
(B, S, 1) values where it returned logits. Training runs the torch.optim adapter
(:class:`~verl.utils.amp_optimizer.AmpOptimizer`, fp32 master weights under autocast) under the shared critic loop
and step contract, on the adapter backends of :mod:`verl.workers.actor.megatron_backend`, on CPU and on GPUs.

LoRA (``critic.model.lora.rank > 0``, verl's megatron form): adapters on the backbone's linear layers as the megatron
actor gets them (:mod:`verl.models.mcore.lora`), the backbone frozen, the value head trained whole.

Tensor parallelism (``critic.megatron.tensor_model_parallel_size``) splits the transformer layers as for the
actor; the value head is whole on every rank of a tensor-parallel group (its input, the final hidden states, is
the same there), so its gradients agree without a reduction and a checkpoint keeps it once. The critic runs
without sequence parallelism: its value head takes whole sequences.

Pipeline stages (``critic.megatron.pipeline_model_parallel_size``) split the layers as for the actor
(:mod:`verl.models.mcore.pipeline`); the value head is on the last stage, which computes the values and the loss.
The value pass relays the hidden states through the stages and broadcasts the last stage's values; the update
relays each micro-batch forward and its gradients back. The embedding is no longer tied to anything (the head
replaced the output layer), so the first stage's copy is not summed with the last stage's.
megatron-core's own optimizer, DDP and schedules are not wired up for the critic yet: asking for them
(``critic.megatron.use_megatron_optimizer: true``) is a ``ValueError`` that says so, and ``auto`` on CUDA falls
back to the adapter with a warning.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl.models.mcore import build_gpt_model, forward_logits, load_hf_weights_into_mcore
from verl.models.mcore.model import batch_gpt_inputs
from verl.models.mcore.pipeline import PipelineStage, broadcast_from_last_stage, stage_forward
from verl.utils.amp_optimizer import build_amp_optimizer
from verl.workers.actor.megatron_backend import megatron_backend
from verl.workers.actor.megatron_builder import adapter_groups, add_megatron_lora, pipeline_stage_note
from verl.workers.actor.update_loop import TORCH_DTYPES, build_loop_parts
from verl.workers.config import CriticConfig
from verl.workers.critic.base import DEFAULT_HEAD_INIT_STD, BasePPOCritic, init_value_head_, response_values

logger = logging.getLogger(__name__)


class MegatronValueHead(torch.nn.Module):
    """``Linear(hidden, 1)`` callable like megatron's output layer: ``(hidden, weight=, runtime_gather_output=)``.

    GPTModel passes its tied embedding as ``weight`` and asks for gathered outputs; a value head has its own
    weight and one output column, so both are ignored. Hidden states are not sequence-parallel here. The linear
    layer is the child ``value``, so its keys (``output_layer.value.weight``) are never taken for the
    vocabulary-parallel ``output_layer.weight`` of a language model when a tensor-parallel state dict is gathered.
    """

    sequence_parallel = False

    def __init__(self, hidden_size: int, *, head_init_std: float = DEFAULT_HEAD_INIT_STD, seed: int = 1):
        super().__init__()
        self.value = torch.nn.Linear(hidden_size, 1)
        init_value_head_(self.value, seed=seed, std=head_init_std)
        self._register_load_state_dict_pre_hook(_rename_flat_head_keys)

    def forward(self, hidden_states, weight=None, runtime_gather_output=None):
        """(S, B, H) -> ((S, B, 1) values, None), the (output, bias) pair megatron's linears return."""
        return self.value(hidden_states), None


def _rename_flat_head_keys(state_dict, prefix, *args) -> None:
    """Checkpoints written before the head had its ``value`` child hold ``output_layer.weight`` / ``.bias``."""
    for name in ("weight", "bias"):
        if prefix + name in state_dict:
            state_dict[f"{prefix}value.{name}"] = state_dict.pop(prefix + name)


def attach_value_head(model: torch.nn.Module, *, head_init_std: float = DEFAULT_HEAD_INIT_STD, seed: int = 1):
    """Replace a GPTModel's output layer by a :class:`MegatronValueHead` (in place; returns the model); with
    pipeline stages, on the last stage (the others keep their layers as they are)."""
    inner = model.module if hasattr(model, "module") else model
    if getattr(inner, "pre_process", False):
        # the embedding is the input layer alone now: a first stage's copy is no longer summed with the last's
        inner.embedding.word_embeddings.weight.shared_embedding = False
    if not getattr(inner, "post_process", False):
        return model  # an earlier pipeline stage: the head is on the last one
    reference = next(inner.parameters())
    head = MegatronValueHead(inner.config.hidden_size, head_init_std=head_init_std, seed=seed)
    inner.output_layer = head.to(device=reference.device, dtype=reference.dtype)
    # the head has its own weight: the embedding must no longer be passed to (or tied with) the output layer
    inner.share_embeddings_and_output_weights = False
    return model


class MegatronPPOCritic(BasePPOCritic):
    """PPO critic over a megatron-core GPTModel with a value head (see :func:`attach_value_head`), on the CPU path
    of :mod:`verl.workers.actor.megatron_backend` (the adapter optimizer, on any device).

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
        self.stage = PipelineStage.of_model(model)  # this rank's pipeline stage (None: the whole model is here)
        # the adapter over pipeline stages or the plain adapter, chosen here once (no megatron-core schedule yet)
        backend = megatron_backend(model, use_megatron_schedule=False, stage=self.stage, run_stage=self.run_stage)
        super().__init__(config, optimizer, lr_scheduler, backend=backend, **loop_parts)

    def model_module(self) -> torch.nn.Module:
        return self.backend.module()

    def _forward_values(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        return forward_logits(self.model, input_ids, attention_mask, position_ids)[..., 0]

    def run_stage(self, micro, temperature: None = None):
        """This rank's stage of the forward pass over a micro-batch's whole columns: (the hidden states received,
        the output), the last stage's output being the (B, S, 1) values."""
        batch = micro.batch
        return stage_forward(self.model, self.stage, **batch_gpt_inputs(batch))

    def _loss_from_model_output(self, micro, output, temperature):
        return self._loss_from_values(micro, _response_values_of(micro, output))

    def _forward_response_values(self, micro):
        if self.stage is None:
            return super()._forward_response_values(micro)
        with self.autocast():
            _, output = self.run_stage(micro)
        shape = tuple(micro.batch["responses"].shape)
        mine = [_response_values_of(micro, output) if self.stage.is_last else None]
        device = micro.batch["input_ids"].device
        return broadcast_from_last_stage(self.stage, mine, [shape], torch.float32, device)[0]


def _response_values_of(micro, output: torch.Tensor) -> torch.Tensor:
    """The (B, R) values of a micro-batch's response positions from the model's (B, S, 1) output."""
    return response_values(output[..., 0].float(), micro.batch["responses"].shape[-1])


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
        rank: this worker's rank.
        process_group: the group gradients are averaged over for a whole model (None: the default group, if
            any); a model split over tensor-parallel ranks takes megatron-core's data-parallel group instead.

    Raises:
        ValueError: a parallel layout or ``use_megatron_optimizer`` value the critic cannot train (see module doc).
    """
    device = torch.device(device)
    dtype = TORCH_DTYPES[critic_config.dtype]
    megatron = critic_config.megatron
    key = f"{CriticConfig.KEY}.megatron"
    megatron.check_device(device.type, key)
    # the one chooser of the training path, told that the critic has no megatron-core optimizer path yet
    megatron.training_path(device.type, key, has_megatron_optimizer_path=False)
    tp, pp = megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size
    megatron.check_fits(hf_config, key)
    model = _build_value_model(hf_config, hf_state_dict, critic_config, device)
    lora = critic_config.model.lora
    lora_note = add_megatron_lora(model, lora, seed=megatron.seed) if lora.rank else ""  # the backbone frozen
    attach_value_head(model, seed=critic_config.seed)  # trained whole, with or without LoRA
    optimizer, scheduler = build_amp_optimizer(
        [param for param in model.parameters() if param.requires_grad],
        critic_config.optim,
        dtype=dtype,
        total_training_steps=total_training_steps,
        **adapter_groups(tp, pp, process_group),
    )
    critic = MegatronPPOCritic(critic_config, model, optimizer, scheduler, **build_loop_parts(critic_config, rank=rank))
    critic.training_path = f"float32 master weights, {dtype} compute, torch.optim adapter on {device}"
    if tp > 1:
        critic.training_path += f", tensor parallel over {tp} ranks"
    critic.training_path += pipeline_stage_note(pp)
    if megatron.use_dist_checkpointing:
        critic.training_path += f", initial weights from {megatron.dist_checkpointing_path}"
    critic.training_path += lora_note
    logger.info("megatron critic: %s", critic.training_path)
    return critic


def _build_value_model(
    hf_config: Any, hf_state_dict: dict[str, torch.Tensor] | None, critic_config: CriticConfig, device: torch.device
) -> torch.nn.Module:
    """The critic's fp32 GPTModel (no sequence parallelism) with the LM's initial weights (a distributed
    checkpoint, else ``hf_state_dict`` when given), before its value head is attached."""
    megatron = critic_config.megatron
    key = f"{CriticConfig.KEY}.megatron"
    overrides = megatron.transformer_overrides(device.type)
    if overrides.get("sequence_parallel"):
        logger.info("%s.sequence_parallel: the critic runs without it (its value head takes whole sequences)", key)
    overrides["sequence_parallel"] = False
    model = build_gpt_model(
        hf_config,
        torch.float32,
        device,
        tensor_model_parallel_size=megatron.tensor_model_parallel_size,
        pipeline_model_parallel_size=megatron.pipeline_model_parallel_size,
        seed=megatron.seed,
        **overrides,
    )
    if megatron.use_dist_checkpointing:
        from verl.models.mcore.dist_checkpoint import load_dist_checkpoint

        # the LM's checkpoint: its head is skipped, the value head replaces it
        path, prefix = megatron.dist_checkpointing_path, megatron.dist_checkpointing_prefix
        load_dist_checkpoint(model, path, prefix=prefix, is_value_model=True)
    elif hf_state_dict is not None:
        load_hf_weights_into_mcore(model, hf_state_dict, hf_config)
    return model
