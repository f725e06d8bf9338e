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
from verl.utils.amp_optimizer import build_amp_optimizer, loss_scale_config_from
from verl.utils.config import cfg_get
from verl.workers.actor.base import resolve_dtype
from verl.workers.actor.megatron_actor import MegatronPPOActor

logger = logging.getLogger(__name__)


def _parallel_size(megatron_config: Any, name: str, key: str) -> int:
    value = cfg_get(megatron_config, name, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{key}.megatron.{name} must be an integer >= 1, got {value!r}; use 1 for no model parallelism."
        )
    return value


def choose_training_path(megatron_config: Any, device: torch.device, key: str) -> tuple[bool, int, int]:
    """(use megatron-core's optimizer, tp, pp), after checking the combination can run on ``device``.

    Raises:
        ValueError: parallel sizes below 1, an unknown ``use_megatron_optimizer``, megatron-core's optimizer
            without CUDA, or model parallelism on the adapter path.
    """
    tp = _parallel_size(megatron_config, "tensor_model_parallel_size", key)
    pp = _parallel_size(megatron_config, "pipeline_model_parallel_size", key)
    choice = cfg_get(megatron_config, "use_megatron_optimizer", "auto")
    if choice not in ("auto", True, False):
        raise ValueError(f"{key}.megatron.use_megatron_optimizer must be auto, true or false, got {choice!r}.")
    on_cuda = device.type == "cuda"
    if choice is True and not on_cuda:
        raise ValueError(
            f"{key}.megatron.use_megatron_optimizer=true needs CUDA: megatron-core's optimizer, DDP and schedules "
            f"are CUDA-only. Use auto (the torch.optim adapter on CPU) or run with trainer.device=cuda."
        )
    use_megatron = on_cuda if choice == "auto" else bool(choice)
    if not use_megatron and (tp, pp) != (1, 1):
        raise ValueError(
            f"{key}.megatron: tensor/pipeline parallel sizes {tp}/{pp} need megatron-core's optimizer path (CUDA); "
            f"on the torch.optim adapter path both must be 1."
        )
    return use_megatron, tp, pp


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
    actor_config: Any,
    *,
    device: str | torch.device,
    total_training_steps: int,
    hf_state_dict: dict[str, torch.Tensor] | None = None,
    rank: int = 0,
    process_group: Any = None,
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
        rank: data-parallel rank.
        process_group: data-parallel group of the adapter path (None: the default group, if any).

    Returns:
        The actor; ``actor.training_path`` says which path runs.

    Raises:
        ValueError: an unsupported dtype, parallel layout or ``use_megatron_optimizer`` (see the module doc).
    """
    device = torch.device(device)
    dtype = resolve_dtype(cfg_get(actor_config, "dtype", "float32"), "actor_rollout_ref.actor.dtype")
    use_megatron, tp, pp = choose_training_path(cfg_get(actor_config, "megatron"), device, "actor_rollout_ref.actor")
    loads_weights = hf_state_dict is not None or isinstance(hf_config_or_path, str | os.PathLike)
    if loads_weights and (tp, pp) != (1, 1):
        raise ValueError(
            "actor_rollout_ref.actor.megatron: loading Hugging Face weights is supported for whole models only "
            f"(tensor/pipeline sizes 1/1), got {tp}/{pp}."
        )
    hf_config, hf_state_dict = _resolve_hf_model(hf_config_or_path, hf_state_dict)
    seed = int(cfg_get(actor_config, "seed", 1))
    # The adapter path keeps fp32 master weights and computes under autocast; megatron-core's path holds
    # fp16/bf16 parameters with fp32 main copies inside its optimizer.
    param_dtype = dtype if use_megatron else torch.float32
    model = build_gpt_model(
        hf_config, param_dtype, device, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, seed=seed
    )
    if hf_state_dict is not None:
        load_hf_weights_into_mcore(model, hf_state_dict, hf_config)
    optim_config = cfg_get(actor_config, "optim")
    if use_megatron:
        model, optimizer, scheduler = _megatron_core_training(model, optim_config, dtype, total_training_steps)
        path = "GPU path: megatron-core DDP, optimizer and schedules"
    else:
        optimizer, scheduler = build_amp_optimizer(
            model.parameters(),
            optim_config,
            dtype=dtype,
            total_training_steps=total_training_steps,
            process_group=process_group,
        )
        path = f"CPU path: torch.optim adapter, fp32 master weights, {dtype} autocast"
    min_loss_scale = loss_scale_config_from(optim_config).min_loss_scale if dtype == torch.float16 else None
    actor = MegatronPPOActor(
        actor_config,
        model,
        optimizer,
        scheduler,
        rank=rank,
        use_megatron_schedule=use_megatron,
        min_loss_scale=min_loss_scale,
    )
    actor.training_path = f"{path} on {device}"
    logger.info("megatron actor: %s", actor.training_path)
    return actor


def _inner_torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer under megatron-core's wrapper(s), whose param groups an LR schedule drives."""
    while not isinstance(optimizer, torch.optim.Optimizer):
        chained = getattr(optimizer, "chained_optimizers", None)
        # a dense GPTModel gets one sub-optimizer (a second one holds MoE expert parameters only)
        assert chained is None or len(chained) == 1, f"expected one chained optimizer, got {len(chained)}"
        optimizer = chained[0] if chained else optimizer.optimizer
    return optimizer


def megatron_optimizer_config(optim_config: Any, dtype: torch.dtype):
    """megatron-core's ``OptimizerConfig`` (Adam, no distributed optimizer) from an ``optim`` config section.

    The fp16 loss-scale settings take the same names and defaults as the CPU adapter's, so both paths start from
    the same scale and back off by the same rule.

    Raises:
        ValueError: a learning rate that is not positive, or invalid loss-scale settings.
    """
    from megatron.core.optimizer import OptimizerConfig

    lr = float(cfg_get(optim_config, "lr", 1e-6))
    if not lr > 0:
        raise ValueError(f"optim.lr must be > 0, got {lr}.")
    betas = list(cfg_get(optim_config, "betas", None) or (0.9, 0.999))
    scale = loss_scale_config_from(optim_config)
    return OptimizerConfig(
        optimizer="adam",
        lr=lr,
        weight_decay=float(cfg_get(optim_config, "weight_decay", 0.01)),
        adam_beta1=float(betas[0]),
        adam_beta2=float(betas[1]),
        adam_eps=float(cfg_get(optim_config, "eps", 1e-8)),
        clip_grad=float(cfg_get(optim_config, "clip_grad", 1.0)),
        fp16=dtype == torch.float16,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        initial_loss_scale=scale.initial_loss_scale,
        min_loss_scale=scale.min_loss_scale,
        loss_scale_window=float(scale.loss_scale_window),
        hysteresis=scale.hysteresis,
        use_distributed_optimizer=False,
    )


def _megatron_core_training(model, optim_config: Any, dtype: torch.dtype, total_training_steps: int):
    """Wrap ``model`` in megatron-core DDP and build its optimizer and LR schedule (CUDA only)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import get_megatron_optimizer

    from verl.utils.torch_functional import build_lr_scheduler

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False
    )
    ddp_model = DistributedDataParallel(model.config, ddp_config, model)
    megatron_config = megatron_optimizer_config(optim_config, dtype)
    optimizer = get_megatron_optimizer(megatron_config, [ddp_model])
    # the schedule scales the loss with the optimizer's scale, and reduces gradients through DDP at the end
    model.config.grad_scale_func = optimizer.scale_loss
    model.config.finalize_model_grads_func = finalize_model_grads
    scheduler = build_lr_scheduler(
        _inner_torch_optimizer(optimizer),
        cfg_get(optim_config, "lr_scheduler", "constant"),
        num_warmup_steps=int(cfg_get(optim_config, "lr_warmup_steps", 0) or 0),
        num_training_steps=max(total_training_steps, 1),
        min_lr_ratio=float(cfg_get(optim_config, "min_lr_ratio", 0.0) or 0.0),
    )
    return ddp_model, optimizer, scheduler
