"""Building the ``megatron`` actor: which training path runs, and everything that path needs.

``actor.megatron.use_megatron_optimizer`` decides: ``auto`` takes megatron-core's own optimizer, DDP and schedules
on CUDA and the torch.optim adapter on CPU; ``true`` insists on megatron-core's (an error without CUDA, because
those parts are CUDA-only); ``false`` takes the adapter everywhere. The chosen path is recorded in
``actor.training_path``, which the worker reports to the driver's log.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from verl.models.mcore import build_gpt_model, load_hf_weights_into_mcore
from verl.utils.amp_optimizer import adamw_kwargs, build_amp_optimizer, build_scheduler
from verl.workers.actor.megatron_actor import MegatronPPOActor
from verl.workers.actor.update_loop import TORCH_DTYPES, build_loop_parts
from verl.workers.config import ActorConfig, OptimConfig

logger = logging.getLogger(__name__)


def _resolve_hf_model(hf_config_or_path: Any, hf_state_dict: dict[str, torch.Tensor] | None):
    """(HF config, HF weights or None): a path loads both from disk unless weights were passed in."""
    if not isinstance(hf_config_or_path, str | os.PathLike):
        return hf_config_or_path, hf_state_dict
    from verl.models.loading import load_hf_causal_lm, load_hf_config

    if hf_state_dict is not None:
        return load_hf_config(hf_config_or_path), hf_state_dict
    hf_model = load_hf_causal_lm(hf_config_or_path, dtype=torch.float32, device="cpu")
    return hf_model.config, hf_model.state_dict()


def build_megatron_actor(
    hf_config_or_path: Any,
    actor_config: ActorConfig,
    *,
    device: str | torch.device,
    total_training_steps: int,
    hf_state_dict: dict[str, torch.Tensor] | None = None,
    trainable: bool = True,
    rank: int = 0,
    process_group: Any = None,
    lora: Any = None,
) -> MegatronPPOActor:
    """A ready megatron actor over a GPTModel shaped like ``hf_config``, holding ``hf_state_dict``'s weights.

    Args:
        hf_config_or_path: a Hugging Face Llama/Qwen2 config, or a model directory (its config, and its weights
            when ``hf_state_dict`` is None).
        actor_config: ``actor_rollout_ref.actor`` (per-rank mini-batch size in samples).
        device: "cpu" or "cuda".
        total_training_steps: length of the LR schedule.
        hf_state_dict: weights of the HF causal LM; None keeps the fresh initialisation (given a config) or
            loads the directory's weights (given a path).
        trainable: False builds a frozen reference: no optimizer, no DDP, no handler, no gradients.
        rank: data-parallel rank.
        process_group: data-parallel group of the adapter path (None: the default group, if any); with tensor
            parallelism megatron-core's own data-parallel group is used instead.
        lora: ``actor_rollout_ref.model.lora`` (verl's megatron form); with ``rank > 0`` a trained actor gets LoRA
            adapters (:mod:`verl.models.mcore.lora`) and trains those alone.

    Returns:
        The actor; ``actor.training_path`` says which path runs.

    Raises:
        ValueError: an unsupported parallel layout or ``use_megatron_optimizer`` (see the module doc).
    """
    device = torch.device(device)
    megatron = actor_config.megatron
    key = f"{ActorConfig.KEY}.megatron"
    megatron.check_device(device.type, key, trainable=trainable)
    use_megatron = megatron.training_path(device.type, key)
    hf_config, hf_state_dict = _resolve_hf_model(hf_config_or_path, hf_state_dict)
    megatron.check_fits(hf_config, key)
    # The adapter path keeps fp32 master weights and computes under autocast; megatron-core's path (a frozen model
    # on it too) holds fp16/bf16 parameters, with fp32 main copies inside its optimizer when trained.
    param_dtype = TORCH_DTYPES[actor_config.dtype] if use_megatron else torch.float32
    model, notes = _build_gpt_model(hf_config, hf_state_dict, megatron, param_dtype, device)
    if trainable and lora is not None and lora.rank > 0:
        notes += add_megatron_lora(model, lora, seed=megatron.seed)
    if not trainable:
        model.eval().requires_grad_(False)
        actor = MegatronPPOActor(actor_config, model, params_in_compute_dtype=use_megatron, rank=rank)
        actor.training_path = f"frozen reference, {param_dtype} parameters on {device}{notes}"
        return actor
    actor, path = _trained_actor(
        model, actor_config, hf_config, use_megatron, total_training_steps, rank, process_group
    )
    actor.training_path = f"{path} on {device}{notes}"
    logger.info("megatron actor: %s", actor.training_path)
    return actor


def _trained_actor(
    model: torch.nn.Module,
    actor_config: ActorConfig,
    hf_config: Any,
    use_megatron: bool,
    total_training_steps: int,
    rank: int,
    process_group: Any,
) -> tuple[MegatronPPOActor, str]:
    """The trained actor over ``model`` and what its path is called: megatron-core's DDP, optimizer and schedules
    (``use_megatron``), or the torch.optim adapter with fp32 master weights."""
    megatron, dtype = actor_config.megatron, TORCH_DTYPES[actor_config.dtype]
    if use_megatron:
        model, optimizer, scheduler = _megatron_core_training(
            model, actor_config.optim, dtype, total_training_steps, megatron
        )
        path = "GPU path: megatron-core DDP, optimizer and schedules"
    else:
        optimizer, scheduler = build_amp_optimizer(
            [param for param in model.parameters() if param.requires_grad],
            actor_config.optim,
            dtype=dtype,
            total_training_steps=total_training_steps,
            **adapter_groups(megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size, process_group),
        )
        path = f"CPU path: torch.optim adapter, fp32 master weights, {dtype} autocast"
    actor = MegatronPPOActor(
        actor_config,
        model,
        optimizer,
        scheduler,
        use_megatron_schedule=use_megatron,
        min_loss_scale=actor_config.optim.min_loss_scale if dtype == torch.float16 else None,
        hf_config=hf_config,
        **build_loop_parts(actor_config, rank=rank),
    )
    return actor, path


def _build_gpt_model(
    hf_config: Any, hf_state_dict: dict | None, megatron: Any, param_dtype: torch.dtype, device: torch.device
) -> tuple[torch.nn.Module, str]:
    """The GPTModel of the ``megatron`` section's parallel layout with its initial weights (a distributed checkpoint,
    else ``hf_state_dict`` when given), and what the role's description says of its stage and weights."""
    pp = megatron.pipeline_model_parallel_size
    model = build_gpt_model(
        hf_config,
        param_dtype,
        device,
        tensor_model_parallel_size=megatron.tensor_model_parallel_size,
        pipeline_model_parallel_size=pp,
        seed=megatron.seed,
        **megatron.transformer_overrides(device.type),
    )
    notes = pipeline_stage_note(pp)
    if megatron.use_dist_checkpointing:
        _load_dist_checkpoint(model, megatron)
        notes += f", initial weights from {megatron.dist_checkpointing_path}"
    elif hf_state_dict is not None:
        load_hf_weights_into_mcore(model, hf_state_dict, hf_config)
    return model, notes


def pipeline_stage_note(stages: int) -> str:
    """What a role's start-up line says of its pipeline stage (nothing for a whole model)."""
    if stages == 1:
        return ""
    from megatron.core import parallel_state

    return f", pipeline stage {parallel_state.get_pipeline_model_parallel_rank() + 1} of {stages}"


def add_megatron_lora(model: torch.nn.Module, lora: Any, seed: int) -> str:
    """Adapters on ``model`` from a ``model.lora`` section (:mod:`verl.models.mcore.lora`), the rest frozen; returns
    what the role's description says of them."""
    from verl.models.mcore.lora import add_lora_adapters

    adapted = add_lora_adapters(
        model,
        rank=lora.rank,
        alpha=lora.alpha,
        target_modules=list(lora.target_modules),
        exclude_modules=list(lora.exclude_modules or ()),
        dropout=lora.dropout,
        dropout_position=lora.dropout_position,
        init_a=lora.lora_A_init_method,
        init_b=lora.lora_B_init_method,
        seed=seed,
    )
    trained = sum(param.numel() for param in model.parameters() if param.requires_grad)
    return f", LoRA rank {lora.rank} on {len(adapted)} layers ({trained} trained parameters)"


def adapter_groups(tp: int, pp: int, process_group: Any) -> dict[str, Any]:
    """The torch.optim adapter's process groups: ``process_group`` for a whole model; for a model split over
    ``tp > 1`` ranks or ``pp > 1`` stages megatron-core's data-parallel group (gradients are averaged over its
    ranks only), its tensor-parallel and pipeline groups (the norm is summed over them) and, with stages, its
    embedding group (a tied embedding's copies on the first and last stage)."""
    if tp == 1 and pp == 1:
        return {"process_group": process_group}
    from megatron.core import parallel_state

    groups = {"process_group": parallel_state.get_data_parallel_group()}
    if tp > 1:
        groups["tensor_parallel_group"] = parallel_state.get_tensor_model_parallel_group()
    if pp > 1:
        groups["pipeline_parallel_group"] = parallel_state.get_pipeline_model_parallel_group()
        groups["embedding_group"] = parallel_state.get_embedding_group()
    return groups


def _inner_torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer under megatron-core's wrapper(s), whose param groups an LR schedule drives."""
    while not isinstance(optimizer, torch.optim.Optimizer):
        chained = getattr(optimizer, "chained_optimizers", None)
        # a dense GPTModel gets one sub-optimizer (a second one holds MoE expert parameters only)
        assert chained is None or len(chained) == 1, f"expected one chained optimizer, got {len(chained)}"
        optimizer = chained[0] if chained else optimizer.optimizer
    return optimizer


def megatron_optimizer_config(optim_config: OptimConfig, dtype: torch.dtype, *, use_distributed_optimizer=False):
    """megatron-core's ``OptimizerConfig`` (Adam) from an ``optim`` config section.

    AdamW's settings come from the same reading as the adapter's (:func:`~verl.utils.amp_optimizer.adamw_kwargs`),
    and the fp16 loss-scale settings take the same names, so both paths start from the same scale and back off by
    the same rule. ``optim.override_optimizer_config`` (its keys checked at start-up) is applied last.
    """
    from megatron.core.optimizer import OptimizerConfig

    adamw = adamw_kwargs(optim_config)
    scale = optim_config.loss_scale()
    return OptimizerConfig(
        optimizer="adam",
        lr=adamw["lr"],
        weight_decay=adamw["weight_decay"],
        adam_beta1=float(adamw["betas"][0]),
        adam_beta2=float(adamw["betas"][1]),
        adam_eps=adamw["eps"],
        clip_grad=optim_config.clip_grad,
        fp16=dtype == torch.float16,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        initial_loss_scale=scale.initial_loss_scale,
        min_loss_scale=scale.min_loss_scale,
        loss_scale_window=float(scale.loss_scale_window),
        hysteresis=scale.hysteresis,
        use_distributed_optimizer=use_distributed_optimizer,
        **(optim_config.override_optimizer_config or {}),
    )


def _load_dist_checkpoint(model: torch.nn.Module, megatron: Any) -> None:
    """The initial weights from ``megatron.dist_checkpointing_path`` (``use_dist_checkpointing``), before DDP and
    the optimizer's fp32 main copies are made from them."""
    from verl.models.mcore.dist_checkpoint import load_dist_checkpoint

    load_dist_checkpoint(model, megatron.dist_checkpointing_path, prefix=megatron.dist_checkpointing_prefix)


def _megatron_core_training(
    model, optim_config: OptimConfig, dtype: torch.dtype, total_training_steps: int, megatron: Any
):
    """Wrap ``model`` in megatron-core DDP and build its optimizer and LR schedule (CUDA only); ``megatron`` is the
    section's :class:`~verl.workers.config.MegatronConfig` (distributed optimizer, DDP overrides)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import get_megatron_optimizer

    ddp_kwargs = {"grad_reduce_in_fp32": True, "overlap_grad_reduce": False, **megatron.ddp_overrides()}
    ddp_config = DistributedDataParallelConfig(
        **ddp_kwargs, use_distributed_optimizer=megatron.use_distributed_optimizer
    )
    ddp_model = DistributedDataParallel(model.config, ddp_config, model)
    megatron_config = megatron_optimizer_config(
        optim_config, dtype, use_distributed_optimizer=megatron.use_distributed_optimizer
    )
    optimizer = get_megatron_optimizer(megatron_config, [ddp_model])
    # the schedule scales the loss with the optimizer's scale, and reduces gradients through DDP at the end
    model.config.grad_scale_func = optimizer.scale_loss
    model.config.finalize_model_grads_func = finalize_model_grads
    scheduler = build_scheduler(_inner_torch_optimizer(optimizer), optim_config, total_training_steps)
    return ddp_model, optimizer, scheduler
