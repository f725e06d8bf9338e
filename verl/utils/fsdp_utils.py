"""Sharding a model with torch FSDP2 (``fully_shard``), and reading it back whole.

:func:`shard_model` is the one place the ``fsdp2`` backend (alias ``fsdp``) shards a module: each wrap unit (by
default the model's decoder layers, as Hugging Face lists them in ``_no_split_modules``) gets its own
``fully_shard``, then the root does. The parameters (fp32, or verl's ``fsdp_config.model_dtype``) become
``DTensor`` shards (``Shard(0)`` over a 1-D device mesh), so every rank keeps 1/N of the master weights, and of the
gradients and optimizer state built on them. Compute runs in the training dtype through FSDP2's
``MixedPrecisionPolicy`` (``param_dtype`` fp16/bf16, ``reduce_dtype`` fp32: gradients are reduce-scattered in
fp32), or in fp32 without a policy; verl's ``fsdp_config.mixed_precision`` changes the gather and reduce dtypes
(:func:`mixed_precision_policy`, :mod:`verl.workers.config.precision`).

:func:`full_state_dict` gathers the whole weights onto rank 0 (for the Hugging Face export and ``model.safetensors``);
:func:`local_numel` says how much of a parameter a rank holds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

logger = logging.getLogger(__name__)


def device_mesh(device_type: str) -> DeviceMesh:
    """The 1-D mesh over every rank of the default process group (which must be initialised).

    Raises:
        ValueError: torch.distributed is not initialised (FSDP2 needs a process group, even of one rank).
    """
    if not dist.is_initialized():
        raise ValueError(
            "strategy=fsdp2 needs torch.distributed initialised, even for one rank; the FSDP2 workers do it "
            "(Worker.init_torch_distributed). In a script call torch.distributed.init_process_group first."
        )
    return init_device_mesh(device_type, (dist.get_world_size(),))


def mixed_precision_policy(
    dtype: torch.dtype, *, param_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype = torch.float32
) -> MixedPrecisionPolicy:
    """The FSDP2 policy of a model computing in ``dtype``: the weights gathered in ``param_dtype`` (None: ``dtype``),
    the gradients reduce-scattered in ``reduce_dtype``. fp16/bf16 over fp32 shards with the defaults: fp32
    gradient reduction. Always explicit: FSDP2 skips a cast to the dtype a shard already has (fp32 over fp32 shards
    costs nothing), while an empty policy would gather shards stored in bf16 (a reference's ``model_dtype``) as
    they are, and an fp32 run would compute that model in bf16."""
    param_dtype = dtype if param_dtype is None else param_dtype
    # reduce in fp32 by default: averaging fp16 gradients over ranks would round (and could overflow) a second time
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def cast_floating_parameters(module: torch.nn.Module, dtype: torch.dtype) -> int:
    """Cast every floating-point parameter of ``module`` to ``dtype`` in place (buffers stay as they are: the rotary
    frequencies of a model loaded in bf16 keep their fp32); returns how many changed. Tied parameters are one
    object, cast once. Before sharding: the shards then hold this dtype (verl's ``fsdp_config.model_dtype``)."""
    changed = 0
    with torch.no_grad():
        for param in module.parameters():
            if param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)
                changed += 1
    return changed


def cast_floating_buffers(module: torch.nn.Module, dtype: torch.dtype) -> int:
    """Cast every floating-point buffer of ``module`` (rotary frequencies, say) to ``dtype`` in place; returns how
    many changed. FSDP2 leaves buffers whole on every rank and casts none of them: this is what verl's
    ``mixed_precision.buffer_dtype`` means here."""
    changed = 0
    for sub in module.modules():
        for name, buffer in list(sub.named_buffers(recurse=False)):
            if buffer is not None and buffer.is_floating_point() and buffer.dtype != dtype:
                sub._buffers[name] = buffer.to(dtype)
                changed += 1
    return changed


def offload_policy(param_offload: bool, device_type: str, key: str) -> OffloadPolicy:
    """``CPUOffloadPolicy`` when asked for on an accelerator; on CPU the parameters already live there."""
    if not param_offload:
        return OffloadPolicy()
    if device_type == "cpu":
        logger.info("%s.param_offload=true: the model is on the CPU already, nothing to offload", key)
        return OffloadPolicy()
    # pinned host memory makes the host-device copies asynchronous
    return CPUOffloadPolicy(pin_memory=True)


def default_wrap_class_names(module: torch.nn.Module) -> list[str]:
    """The decoder-layer class names Hugging Face models declare in ``_no_split_modules`` (empty for others)."""
    names: list[str] = []
    for sub in module.modules():
        for name in getattr(sub, "_no_split_modules", None) or []:
            if name not in names:
                names.append(name)
    return names


def wrap_units(module: torch.nn.Module, class_names: Iterable[str] | None, key: str) -> list[torch.nn.Module]:
    """The submodules that get their own ``fully_shard`` (the root excluded), in ``modules()`` order.

    Args:
        module: the model to shard.
        class_names: module class names from ``wrap_policy.transformer_layer_cls_to_wrap``; None: the model's
            decoder layers (:func:`default_wrap_class_names`).
        key: the config key of the wrap policy, for messages.

    Raises:
        ValueError: a configured class name matches no submodule.
    """
    configured = class_names is not None
    names = list(class_names) if configured else default_wrap_class_names(module)
    present = {type(sub).__name__ for sub in module.modules()}
    unknown = [name for name in names if name not in present]
    if configured and unknown:
        raise ValueError(
            f"{key}.transformer_layer_cls_to_wrap names {unknown}, which this model does not have; use class names "
            f"of its submodules (e.g. {sorted(n for n in present if 'Layer' in n)[:5]}) or null for its decoder layers."
        )
    units = [sub for sub in module.modules() if sub is not module and type(sub).__name__ in names]
    if not units:
        logger.warning("%s: no wrap units found; the whole model is one FSDP2 unit (gathered at once)", key)
    return units


def shard_model(
    module: torch.nn.Module,
    *,
    mesh: DeviceMesh,
    dtype: torch.dtype,
    reshard_after_forward: bool,
    param_offload: bool,
    wrap_class_names: Iterable[str] | None,
    key: str,
    forward_prefetch: bool = False,
    mp_policy: MixedPrecisionPolicy | None = None,
) -> FSDPModule:
    """Shard ``module`` in place with FSDP2: each wrap unit, then the root.

    Args:
        module: the model (fp32 unless ``fsdp_config.model_dtype`` says otherwise), on the CPU or on the mesh's
            device (FSDP2 moves the shards to the mesh device); its shards keep its parameters' dtype.
        mesh: the 1-D data-parallel mesh (:func:`device_mesh`).
        dtype: the compute dtype (fp16/bf16 through the mixed-precision policy, or fp32).
        reshard_after_forward: free the gathered parameters after each unit's forward (re-gathered in backward).
        param_offload: keep the shards (and gradients) in CPU memory (``CPUOffloadPolicy``).
        wrap_class_names: ``wrap_policy.transformer_layer_cls_to_wrap`` (None: the decoder layers).
        key: the model's ``fsdp_config`` key, for messages.
        forward_prefetch: each wrap unit issues the next unit's all-gather before its own forward runs (FSDP2's
            explicit prefetch; verl's ``fsdp_config.forward_prefetch``), so the gather overlaps the compute.
        mp_policy: the mixed-precision policy (verl's ``fsdp_config.mixed_precision``); None:
            :func:`mixed_precision_policy` of ``dtype``.

    Returns:
        The same module, now an ``FSDPModule`` whose parameters are ``DTensor`` shards.
    """
    kwargs = {
        "mesh": mesh,
        "mp_policy": mixed_precision_policy(dtype) if mp_policy is None else mp_policy,
        "reshard_after_forward": reshard_after_forward,
        "offload_policy": offload_policy(param_offload, mesh.device_type, key),
    }
    units = wrap_units(module, wrap_class_names, f"{key}.wrap_policy")
    sharded = _shard(module, units, kwargs)
    if forward_prefetch:
        for unit, next_unit in zip(units, units[1:]):
            unit.set_modules_to_forward_prefetch([next_unit])
    return sharded


def _shard(module: torch.nn.Module, units: list[torch.nn.Module], kwargs: dict) -> FSDPModule:
    # inner units first: fully_shard on the root then manages only the parameters no unit claimed
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(module, **kwargs)
    logger.info(
        "FSDP2: %d wrap units + root over %d rank(s), gathered in %s, reduced in %s, reshard_after_forward=%s",
        len(units),
        kwargs["mesh"].size(),
        kwargs["mp_policy"].param_dtype or "the shards' dtype",
        kwargs["mp_policy"].reduce_dtype or "the gathered dtype",
        kwargs["reshard_after_forward"],
    )
    return module


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a ``DTensor`` (a plain tensor is its own part)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def local_numel(tensor: torch.Tensor) -> int:
    """Elements of ``tensor`` this rank holds."""
    return local_tensor(tensor).numel()


def sharded_state_bytes(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """Bytes this rank holds of the parameters, the gradients and the optimizer state."""

    def nbytes(tensor: torch.Tensor) -> int:
        local = local_tensor(tensor)
        return local.numel() * local.element_size()

    params = list(module.parameters())
    states = [] if optimizer is None else [v for s in optimizer.state.values() for v in s.values()]
    return {
        "params": sum(nbytes(p) for p in params),
        "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(nbytes(v) for v in states if isinstance(v, torch.Tensor)),
    }


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights, gathered on rank 0 into CPU memory; other ranks get an empty dict.

    Collective: every rank of the mesh must call it. The keys are the unsharded model's (``module.state_dict()``).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # cpu_offload gathers one tensor at a time and keeps it only on rank 0: peak memory is one full tensor per rank
    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def enable_activation_checkpointing(module: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass (the Hugging Face model's mechanism).

    Called before sharding: the recompute then runs the layer's FSDP2 hooks again, which re-gather its parameters.

    Raises:
        ValueError: the module is not a Hugging Face model that supports it.
    """
    # non-reentrant: correct with inputs that need no gradient, under autocast, and with FSDP2's hooks
    kwargs = {"use_reentrant": False}
    if hasattr(module, "activation_checkpointing_enable"):  # transformers >= 5.x; the old name is deprecated
        module.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(module, "gradient_checkpointing_enable"):
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(
            f"enable_gradient_checkpointing=true, but {type(module).__name__} is not a Hugging Face model with "
            "activation checkpointing; set it to false."
        )
