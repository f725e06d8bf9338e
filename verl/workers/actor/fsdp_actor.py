"""The ``fsdp2`` backend's actor (alias ``fsdp``): a Hugging Face causal LM sharded with torch FSDP2.

Every rank holds 1/N of the fp32 master weights, of their gradients and of the AdamW state
(:func:`verl.utils.fsdp_utils.shard_model`); forward passes gather one decoder layer at a time and compute in the
training dtype through FSDP2's mixed-precision policy. The update loop, the losses and the optimizer-step contract
are the shared ones (:class:`~verl.workers.actor.update_loop.UpdateLoop`); the step itself is
:class:`~verl.utils.fsdp_optimizer.ShardedAmpOptimizer`, whose verdict every rank agrees on before anyone updates.

:class:`FSDPUpdateLoopMixin` is what any FSDP2-trained model (actor, critic) changes in the loop: autocast on the
compute device (parameters may sit in CPU memory under offload) and sharded checkpoints
(:mod:`verl.utils.fsdp_checkpoint`), whose save and load are collective: every rank calls them.
:func:`build_fsdp_actor` is what a worker calls; it also builds the frozen reference (no optimizer, no gradients).

Every rank must run the same number of forward passes (each one gathers parameters from all ranks): the data
dispatch gives every rank the same number of rows, and the rollout agrees on when to stop sampling
(:meth:`verl.workers.rollout.naive_rollout.NaiveRollout.synchronize_stop`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from transformers import PreTrainedModel

from verl.utils.checkpoint import TRAIN_STATE_FILE, WEIGHTS_FILE, CheckpointError, load_state, save_state, save_weights
from verl.utils.fsdp_checkpoint import HF_EXPORT_DIR, SHARDED_DIR, export_huggingface, load_sharded, save_sharded
from verl.utils.fsdp_optimizer import build_sharded_amp_optimizer
from verl.utils.fsdp_utils import enable_activation_checkpointing, full_state_dict, shard_model
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.actor.update_loop import TORCH_DTYPES, build_loop_parts
from verl.workers.config import ActorConfig

logger = logging.getLogger(__name__)


class FSDPUpdateLoopMixin:
    """FSDP2's changes to an :class:`~verl.workers.actor.update_loop.UpdateLoop`: compute device, checkpoints.

    The class using it sets ``self.mesh`` (the data-parallel :class:`DeviceMesh`) and may set
    ``self.hf_export = True`` to write a Hugging Face directory with each checkpoint.
    """

    mesh: DeviceMesh
    hf_export: bool = False

    def autocast(self):
        """Mixed precision on the mesh's device (the parameters' own device is the CPU under offload)."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.mesh.device_type, dtype=self.dtype)

    def _torch_optimizer(self) -> torch.optim.Optimizer | None:
        return None if self.optimizer is None else self.optimizer.optimizer

    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: every rank writes its shards to ``sharded/``; rank 0 the gathered ``model.safetensors``,
        ``train_state.pt`` and, for a Hugging Face model, the ``huggingface/`` export.

        The caller makes the directory atomic (see :func:`verl.utils.checkpoint.atomic_directory`).
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        module = self.model_module()
        group = self.mesh.get_group()
        save_sharded(directory / SHARDED_DIR, module, self._torch_optimizer(), group)
        weights = full_state_dict(module)  # collective; only rank 0 receives the tensors
        if self.mesh.get_local_rank() != 0:
            return
        save_weights(directory / WEIGHTS_FILE, weights)
        save_state(directory / TRAIN_STATE_FILE, self.training_state_dict())
        if self.hf_export:
            export_huggingface(directory / HF_EXPORT_DIR, module, directory / WEIGHTS_FILE)

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Collective: restore the shards of weights and optimizer state, then what every rank shares.

        Raises:
            CheckpointError: the directory has no sharded checkpoint (it was written by another backend), or a
                file is missing or damaged.
        """
        directory = Path(directory)
        sharded = directory / SHARDED_DIR
        if not sharded.is_dir():
            raise CheckpointError(
                sharded,
                "is missing: this checkpoint was not written by the fsdp2 backend (dp and megatron write whole "
                "weights only), so its optimizer state cannot be resharded. Resume with the strategy that wrote it",
            )
        load_sharded(sharded, self.model_module(), self._torch_optimizer(), self.mesh.get_group())
        if self.optimizer is not None and self.optimizer.offload_state:
            self.optimizer.move_state(torch.device("cpu"))
        self.load_training_state_dict(load_state(directory / TRAIN_STATE_FILE))


class FSDPPPOActor(FSDPUpdateLoopMixin, DataParallelPPOActor):
    """PPO actor over an FSDP2-sharded causal LM: the ``dp`` actor's forward pass, FSDP2's device and checkpoints.

    Args:
        config: the ``actor_rollout_ref.actor`` config (per-rank mini-batch size in samples).
        actor_module: the sharded module, called as ``module(input_ids=, attention_mask=, position_ids=)``,
            returning logits (B, S, V) or an object with ``.logits``.
        optimizer: a :class:`~verl.utils.fsdp_optimizer.ShardedAmpOptimizer` (None: a frozen reference).
        lr_scheduler: its LR schedule.
        mesh: the data-parallel mesh the module is sharded over.
        use_remove_padding: run forward passes on the packed real tokens (``model.use_remove_padding``; see
            :mod:`verl.utils.padding_free`). Each rank packs its own rows; the collectives do not depend on the
            packed length, so ranks may pack to different lengths.
        **loop_parts: ``update_outcome_handler``, ``fault_injector``, ``rank`` (see :func:`build_loop_parts`).
    """

    training_path = "fsdp2"

    def __init__(
        self,
        config: ActorConfig,
        actor_module: torch.nn.Module,
        optimizer=None,
        lr_scheduler=None,
        *,
        mesh: DeviceMesh,
        use_remove_padding: bool = False,
        **loop_parts,
    ):
        self.mesh = mesh
        self.hf_export = isinstance(actor_module, PreTrainedModel)
        super().__init__(
            config, actor_module, optimizer, lr_scheduler, use_remove_padding=use_remove_padding, **loop_parts
        )


def shard_for_training(module, config, fsdp_config, *, mesh, total_training_steps, wrap_class_names, key, trainable):
    """Shard ``module`` per ``fsdp_config`` and, when ``trainable``, build its sharded AdamW and LR schedule.

    Args:
        module: the fp32 model, in CPU memory or on the mesh device.
        config: the trained model's section (actor or critic): its ``dtype`` and ``optim``.
        fsdp_config: ``param_offload``, ``reshard_after_forward`` (and ``optimizer_offload`` when trainable).
        mesh: the data-parallel mesh.
        total_training_steps: length of the LR schedule.
        wrap_class_names: ``wrap_policy.transformer_layer_cls_to_wrap``.
        key: the ``fsdp_config`` section's full key, for messages.
        trainable: False shards a frozen model and builds no optimizer.

    Returns:
        (optimizer, lr_scheduler), both None for a frozen model.
    """
    dtype = TORCH_DTYPES[config.dtype]
    shard_model(
        module,
        mesh=mesh,
        dtype=dtype,
        reshard_after_forward=fsdp_config.reshard_after_forward,
        param_offload=fsdp_config.param_offload,
        wrap_class_names=wrap_class_names,
        key=key,
    )
    if not trainable:
        return None, None
    logger.info("fsdp2: float32 master shards over %d rank(s), %s compute (%s)", mesh.size(), dtype, key)
    return build_sharded_amp_optimizer(
        module,
        config.optim,
        mesh=mesh,
        dtype=dtype,
        total_training_steps=total_training_steps,
        optimizer_offload=fsdp_config.optimizer_offload,
        param_offload=fsdp_config.param_offload,
        key=key,
    )


def build_fsdp_actor(
    config: ActorConfig,
    module: torch.nn.Module,
    *,
    mesh: DeviceMesh,
    total_training_steps: int,
    trainable: bool = True,
    fsdp_config: Any = None,
    enable_gradient_checkpointing: bool = False,
    use_remove_padding: bool = False,
    rank: int = 0,
) -> FSDPPPOActor:
    """Shard ``module`` (fp32, on the CPU or the mesh device) with FSDP2 and build the actor around it.

    Args:
        config: the actor config; its ``fsdp_config`` gives the wrap policy and the optimizer offload.
        module: the Hugging Face causal LM (or any module returning logits), fp32.
        mesh: the data-parallel mesh (:func:`verl.utils.fsdp_utils.device_mesh`).
        total_training_steps: length of the LR schedule.
        trainable: False gives a frozen reference: no optimizer, no handler, no gradients.
        fsdp_config: the section with ``param_offload`` and ``reshard_after_forward`` (default
            ``config.fsdp_config``; the reference passes ``actor_rollout_ref.ref.fsdp_config``).
        enable_gradient_checkpointing: recompute activations in the backward pass (trainable models only).
        use_remove_padding: padding-free forward passes (``actor_rollout_ref.model.use_remove_padding``).
        rank: data-parallel rank.
    """
    fsdp_config = config.fsdp_config if fsdp_config is None else fsdp_config
    if not trainable:
        module.eval().requires_grad_(False)
    elif enable_gradient_checkpointing:
        enable_activation_checkpointing(module)
    optimizer, scheduler = shard_for_training(
        module,
        config,
        fsdp_config,
        mesh=mesh,
        total_training_steps=total_training_steps,
        wrap_class_names=config.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap,
        key=f"{ActorConfig.KEY}.fsdp_config" if trainable else "actor_rollout_ref.ref.fsdp_config",
        trainable=trainable,
    )
    if not trainable:
        return FSDPPPOActor(config, module, mesh=mesh, use_remove_padding=use_remove_padding, rank=rank)
    return FSDPPPOActor(
        config,
        module,
        optimizer,
        scheduler,
        mesh=mesh,
        use_remove_padding=use_remove_padding,
        **build_loop_parts(config, rank=rank),
    )
