"""A torch.optim optimizer behind megatron-core's optimizer-step contract, with fp16 dynamic loss scaling.

megatron-core's ``MegatronOptimizer.step()`` returns ``(update_successful, grad_norm, num_zeros_in_grad)`` and
exposes ``get_loss_scale()``; both actors end every mini-batch by reading exactly that. :class:`AmpOptimizer` gives
a plain ``torch.optim`` optimizer the same interface, so the ``dp`` actor and the CPU path of the ``megatron`` actor
share one step contract with megatron-core's own optimizer on GPU.

fp16 multiplies the loss by a dynamic loss scale, divides the gradients by it before the step, and takes a
non-finite global gradient norm as the overflow verdict. The scale follows megatron-core's dynamic rule, with the
two parts torch's ``GradScaler`` lacks: a floor (``min_loss_scale``; without one the scale decays towards zero and
the run stalls silently) and hysteresis (the number of overflows tolerated before backing off). A skipped update
leaves the weights, the moments and the optimizer's step count untouched, because ``optimizer.step()`` is simply
not called. With several data-parallel ranks the gradients are
averaged before the check and the verdict is all-reduced, so every rank takes the same decision.

Tensor parallelism (megatron-core's layers, each rank holding a shard of the weights): the gradient norm is
global over the shards, each weight counted once (a weight megatron marks ``tensor_model_parallel`` adds its
shard's squares over the tensor-parallel group; a replicated one, identical on every rank, is counted once), and
the verdict is all-reduced over the whole world (every tensor- and data-parallel rank), so a NaN on one shard makes
every rank skip the same step. With sequence parallelism the weights megatron marks ``sequence_parallel`` get
their gradients summed over the tensor-parallel group first (each rank saw part of the sequence).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, Protocol

import torch
import torch.distributed as dist


class LossScaleConfig(Protocol):
    """What the dynamic loss scale reads of its settings (:class:`verl.workers.config.LossScaleConfig`, a dataclass).

    The schema lives with the workers' config, above this module; only these attributes are read here.
    """

    initial_loss_scale: float
    min_loss_scale: float
    loss_scale_window: int
    hysteresis: int


class OptimConfig(Protocol):
    """What the optimizer builders read of an ``optim`` section (:class:`verl.workers.config.OptimConfig`)."""

    lr: float
    betas: Any
    eps: float
    weight_decay: float
    clip_grad: float
    min_lr_ratio: float | None
    num_cycles: float

    def loss_scale(self) -> LossScaleConfig: ...

    def floor_ratio(self) -> float: ...

    def scheduler_name(self) -> str: ...

    def num_warmup_steps(self, total_training_steps: int) -> int: ...

    def decay_steps(self, total_training_steps: int) -> int: ...


class DynamicLossScale:
    """The scale of megatron-core's DynamicGradScaler: back off on overflow after hysteresis, grow after a window."""

    def __init__(self, config: LossScaleConfig):
        self.config = config
        self.scale = float(config.initial_loss_scale)
        self.num_clean_steps = 0
        self.hysteresis_left = config.hysteresis

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.num_clean_steps = 0
            self.hysteresis_left -= 1
            if self.hysteresis_left <= 0:
                self.scale = max(self.scale * 0.5, self.config.min_loss_scale)
        else:
            self.num_clean_steps += 1
            if self.num_clean_steps == self.config.loss_scale_window:
                self.num_clean_steps = 0
                self.hysteresis_left = self.config.hysteresis
                self.scale *= 2.0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "num_clean_steps": self.num_clean_steps, "hysteresis_left": self.hysteresis_left}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.num_clean_steps = int(state["num_clean_steps"])
        self.hysteresis_left = int(state["hysteresis_left"])


class AmpOptimizer:
    """``torch.optim`` + optional fp16 loss scaling, with megatron-core's ``step()`` contract.

    Args:
        optimizer: the wrapped optimizer (its param groups are the trained parameters).
        clip_grad: max global gradient norm (<= 0 disables clipping; the norm is still computed).
        loss_scale: dynamic loss-scale settings, or None for fp32/bf16 (no scaling).
        process_group: data-parallel group whose gradients are averaged; None = the default group when
            torch.distributed is initialised with more than one rank.
        tensor_parallel_group: the tensor-parallel group of a model whose weights are split over ranks (None: the
            model is whole on every rank); the norm is then summed over it and the verdict agreed by the world.
        pipeline_parallel_group: the pipeline group of a model whose layers are split into stages (None: one
            stage); each stage's share of the squared norm is summed over it, and the verdict agreed by the world.
        embedding_group: with pipeline stages and tied embeddings, the group of the first and the last stage, which
            hold a copy each of the embedding matrix (marked ``shared_embedding``): their gradients are summed over
            it, as megatron-core does, so that both copies take the same step.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        clip_grad: float = 1.0,
        loss_scale: LossScaleConfig | None = None,
        process_group: Any = None,
        tensor_parallel_group: Any = None,
        pipeline_parallel_group: Any = None,
        embedding_group: Any = None,
    ):
        self.optimizer = optimizer
        self.clip_grad = float(clip_grad)
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.process_group = process_group
        self.tensor_parallel_group = tensor_parallel_group
        self.pipeline_parallel_group = pipeline_parallel_group
        self.embedding_group = embedding_group
        self.split_model = tensor_parallel_group is not None or pipeline_parallel_group is not None
        # the default group would average gradients across model-parallel ranks, whose parts differ
        assert not self.split_model or process_group is not None, "a split model needs its data-parallel group"
        self.loss_scale = DynamicLossScale(loss_scale) if loss_scale is not None else None

    # ------------------------------------------------------------------ the megatron-core interface

    def get_loss_scale(self) -> float | None:
        """The scale the next backward pass uses; None without loss scaling."""
        return None if self.loss_scale is None else self.loss_scale.scale

    @property
    def min_loss_scale(self) -> float | None:
        return None if self.loss_scale is None else self.loss_scale.config.min_loss_scale

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss if self.loss_scale is None else loss * self.loss_scale.scale

    def backward(self, loss: torch.Tensor) -> None:
        self.scale_loss(loss).backward()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def step(self) -> tuple[bool, float | None, int | None]:
        """Average, unscale, check and clip the gradients, then update unless they are non-finite.

        Returns:
            (update_successful, grad_norm, num_zeros_in_grad): grad_norm is the global norm before clipping (None
            when the update was skipped on overflow, as megatron-core reports it); zeros are not counted (None).
        """
        world = self._world_size()
        if world > 1:
            self._all_reduce_grads(world)
        if self.tensor_parallel_group is not None:
            self._sum_sequence_parallel_grads()
        if self.embedding_group is not None:
            self._sum_tied_embedding_grads()
        params = [p for p in self.params if p.grad is not None]
        if self.loss_scale is not None:
            inv_scale = 1.0 / self.loss_scale.scale
            for param in params:
                param.grad.mul_(inv_scale)
        max_norm = self.clip_grad if self.clip_grad > 0 else math.inf
        # An overflow anywhere makes the global norm inf or NaN: the norm is the overflow check, in one pass.
        if not self.split_model:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm) if params else torch.zeros(())
        else:
            grad_norm = self._model_parallel_norm(params)
            if params:
                torch.nn.utils.clip_grads_with_norm_(params, max_norm, grad_norm)
        verdict = torch.stack([(~torch.isfinite(grad_norm)).float(), grad_norm.float()])
        verdict_group = None if self.split_model else self.process_group  # None: the world
        if world > 1 or self.split_model:
            # gradients are already averaged; this makes the decision identical even if one rank errs, and over
            # model-parallel ranks, whose parts differ
            flag = verdict[:1].clone()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=verdict_group)
            verdict[:1] = flag
        nonfinite, norm_value = verdict.tolist()
        successful = nonfinite == 0
        if successful:
            self.optimizer.step()
        if self.loss_scale is not None:
            self.loss_scale.update(found_inf=not successful)
        if not successful:
            return False, (None if self.loss_scale is not None else norm_value), None
        return True, norm_value, None

    # ------------------------------------------------------------------ helpers and state

    def _model_parallel_norm(self, params: list[torch.Tensor]) -> torch.Tensor:
        """Global L2 norm of a split model's gradients: split weights' squares summed over the tensor-parallel
        group, replicated weights (identical on every rank of the group) counted once, then each stage's share
        summed over the pipeline group (the last stage's copy of a tied embedding, marked ``shared``, left out).
        Computed where the gradients are (an NCCL group reduces device tensors only), with one host sync in the
        caller."""
        device = params[0].grad.device if params else torch.device("cpu")
        split = torch.zeros((), dtype=torch.float32, device=device)
        replicated = torch.zeros((), dtype=torch.float32, device=device)
        for param in params:
            if getattr(param, "shared", False):
                continue
            squares = param.grad.detach().float().pow(2).sum()
            if getattr(param, "tensor_model_parallel", False):
                split += squares
            else:
                replicated += squares
        if self.tensor_parallel_group is not None:
            dist.all_reduce(split, group=self.tensor_parallel_group)
        total = split + replicated
        if self.pipeline_parallel_group is not None:
            dist.all_reduce(total, group=self.pipeline_parallel_group)
        return total.sqrt()

    def _sum_tied_embedding_grads(self) -> None:
        """The two copies of a tied embedding (first and last stage) take the sum of their gradients."""
        grads = [p.grad for p in self.params if p.grad is not None and getattr(p, "shared_embedding", False)]
        _all_reduce_in_place(grads, self.embedding_group)

    def _sum_sequence_parallel_grads(self) -> None:
        """Weights megatron marks ``sequence_parallel`` (the layer norms, with sequence parallelism on) see only
        this rank's part of the sequence: their gradients are summed over the tensor-parallel group, as
        megatron-core's DDP does when it finishes a backward, so that the replicated weights stay equal."""
        grads = [p.grad for p in self.params if p.grad is not None and getattr(p, "sequence_parallel", False)]
        _all_reduce_in_place(grads, self.tensor_parallel_group)

    def _world_size(self) -> int:
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self.process_group)

    def _all_reduce_grads(self, world: int) -> None:
        _all_reduce_in_place([p.grad for p in self.params if p.grad is not None], self.process_group, divide_by=world)

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "loss_scale": None if self.loss_scale is None else self.loss_scale.state_dict(),
            "loss_scale_config": None if self.loss_scale is None else asdict(self.loss_scale.config),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.loss_scale is not None and state.get("loss_scale") is not None:
            self.loss_scale.load_state_dict(state["loss_scale"])

    @property
    def param_groups(self):
        return self.optimizer.param_groups


def _all_reduce_in_place(grads: list[torch.Tensor], group: Any, divide_by: int = 1) -> None:
    """Sum ``grads`` over ``group`` in one flat all-reduce (divided by ``divide_by``: a mean over its ranks)."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    if divide_by != 1:
        flat /= divide_by
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def adamw_kwargs(optim: OptimConfig) -> dict[str, Any]:
    """AdamW's keyword arguments from an ``optim`` section: the one reading of them, for every optimizer built."""
    return {
        "lr": optim.lr,
        "betas": tuple(optim.betas),
        "eps": optim.eps,
        "weight_decay": optim.weight_decay,
    }


def _can_fuse(params: list[torch.Tensor]) -> bool:
    """Whether AdamW may run as one fused kernel: plain (not sharded DTensor) floating-point tensors on CPU or CUDA.

    The fused step does the same arithmetic in one pass over all parameters; on 2 CPU cores it took 5 ms for a
    9.5M-parameter model against 20 ms for the default per-tensor loop.
    """
    from torch.distributed.tensor import DTensor

    return bool(params) and all(
        not isinstance(p, DTensor) and p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params
    )


def build_scheduler(torch_optimizer: torch.optim.Optimizer, optim: OptimConfig, total_training_steps: int):
    """The LR schedule of an ``optim`` section over ``torch_optimizer``'s param groups."""
    from verl.utils.torch_functional import build_lr_scheduler

    return build_lr_scheduler(
        torch_optimizer,
        optim.scheduler_name(),
        num_warmup_steps=optim.num_warmup_steps(total_training_steps),
        num_training_steps=max(optim.decay_steps(total_training_steps), 1),
        min_lr_ratio=optim.floor_ratio(),
        num_cycles=optim.num_cycles,
    )


def build_amp_optimizer(
    params,
    optim: OptimConfig,
    *,
    dtype: torch.dtype,
    total_training_steps: int,
    **groups: Any,
):
    """AdamW wrapped in :class:`AmpOptimizer` (loss scaling in fp16), and its LR schedule.

    Args:
        params: the trained parameters.
        optim: a validated ``optim`` section (:class:`~verl.workers.config.OptimConfig`).
        dtype: the compute dtype; float16 turns on the dynamic loss scale of ``optim``.
        total_training_steps: length of the LR schedule.
        **groups: the process groups of :class:`AmpOptimizer` (``process_group``, the data-parallel one gradients
            are averaged over; for a model split over ranks ``tensor_parallel_group``, ``pipeline_parallel_group``,
            ``embedding_group``).

    Returns:
        (optimizer, lr_scheduler)
    """
    params = list(params)
    adamw = torch.optim.AdamW(params, **adamw_kwargs(optim), fused=_can_fuse(params))
    loss_scale = optim.loss_scale() if dtype == torch.float16 else None
    optimizer = AmpOptimizer(
        adamw,
        clip_grad=optim.clip_grad,
        loss_scale=loss_scale,
        **groups,
    )
    return optimizer, build_scheduler(adamw, optim, total_training_steps)
