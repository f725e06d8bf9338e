"""The ``fsdp2`` backend's critic: the ``dp`` value model (:class:`ValueModel`) sharded with torch FSDP2.

The backbone's decoder layers and the root (backbone rest + value head) are FSDP2 units; the optimizer step, the
fp16 loss scale and the sharded checkpoints are the FSDP2 actor's (:class:`~verl.workers.actor.backend.FSDPBackend`,
:class:`~verl.utils.fsdp_optimizer.ShardedAmpOptimizer`). The critic writes no Hugging Face export: a backbone with
a value head is no ``transformers`` class. :func:`build_fsdp_critic` is what a worker calls.
"""

from __future__ import annotations

import logging

import torch
from torch.distributed.device_mesh import DeviceMesh

from verl.utils.cpu_linear import use_onednn_linear
from verl.utils.fsdp_utils import enable_activation_checkpointing
from verl.workers.actor.backend import FSDPBackend
from verl.workers.actor.fsdp_actor import shard_for_training
from verl.workers.actor.update_loop import TORCH_DTYPES, build_loop_parts
from verl.workers.config import CriticConfig
from verl.workers.config.precision import model_dtype_of
from verl.workers.critic.dp_critic import DataParallelPPOCritic, ValueModel

logger = logging.getLogger(__name__)


class FSDPPPOCritic(DataParallelPPOCritic):
    """PPO critic over an FSDP2-sharded :class:`ValueModel`: the ``dp`` critic's forward on the
    :class:`~verl.workers.actor.backend.FSDPBackend` (autocast on the mesh's device, sharded checkpoints).

    Args:
        config: the ``critic`` config (per-rank mini-batch size in samples).
        critic_module: the sharded value model, returning (B, S) values.
        optimizer: a :class:`~verl.utils.fsdp_optimizer.ShardedAmpOptimizer`.
        lr_scheduler: its LR schedule.
        mesh: the data-parallel mesh the module is sharded over.
        **loop_parts: ``update_outcome_handler``, ``fault_injector``, ``rank`` (see ``build_loop_parts``).

    ``critic.model.enable_activation_offload`` keeps what each update's forward pass saves in CPU memory.
    """

    training_path = "fsdp2"

    def __init__(
        self, config: CriticConfig, critic_module: torch.nn.Module, optimizer, lr_scheduler=None, *, mesh, **loop_parts
    ):
        # no Hugging Face export: a backbone with a value head is no transformers class
        backend = FSDPBackend(mesh, hf_export=False, offload_activations=config.model.enable_activation_offload)
        super().__init__(config, critic_module, optimizer, lr_scheduler, backend=backend, **loop_parts)


def build_fsdp_critic(
    model_path_or_module: str | torch.nn.Module | None,
    critic_config: CriticConfig,
    *,
    mesh: DeviceMesh,
    total_training_steps: int,
    rank: int = 0,
) -> FSDPPPOCritic:
    """A ready ``fsdp2`` critic: value model sharded per ``critic.model.fsdp_config``, AdamW, schedule, handler.

    Args:
        model_path_or_module: the LM whose backbone the value model starts from (a path, ``None``/"default", a
            ``*ForCausalLM`` module, or a :class:`ValueModel`); built in CPU memory, in
            ``critic.model.fsdp_config.model_dtype`` (a :class:`ValueModel` handed in keeps its own), then sharded.
        critic_config: the ``critic`` config, ``ppo_mini_batch_size`` in samples per rank.
        mesh: the data-parallel mesh (:func:`verl.utils.fsdp_utils.device_mesh`).
        total_training_steps: length of the LR schedule.
        rank: data-parallel rank.
    """
    key = "critic.model.fsdp_config"
    fsdp_config = critic_config.model.fsdp_config
    if isinstance(model_path_or_module, ValueModel):
        module = model_path_or_module
    else:
        # the whole model is built once in CPU memory; fully_shard then keeps this rank's shards on the mesh device
        module = ValueModel.from_pretrained_lm(
            model_path_or_module,
            device="cpu",
            seed=critic_config.seed,
            trust_remote_code=critic_config.model.trust_remote_code,
            config_overrides=critic_config.model.override_config,
            lora=critic_config.model,
            dtype=TORCH_DTYPES[model_dtype_of(fsdp_config)],
        )
    if critic_config.model.enable_gradient_checkpointing:
        enable_activation_checkpointing(module.backbone)
    # padding-free passes (critic.model.use_remove_padding); each rank packs its own rows to its own length
    module.use_remove_padding = critic_config.model.use_remove_padding
    if critic_config.model.use_onednn_linear:
        use_onednn_linear(module, mesh.device_type)
    optimizer, scheduler = shard_for_training(
        module,
        critic_config,
        fsdp_config,
        mesh=mesh,
        total_training_steps=total_training_steps,
        wrap_class_names=fsdp_config.wrap_policy.transformer_layer_cls_to_wrap,
        key=key,
        trainable=True,
    )
    return FSDPPPOCritic(
        critic_config, module, optimizer, scheduler, mesh=mesh, **build_loop_parts(critic_config, rank=rank)
    )
