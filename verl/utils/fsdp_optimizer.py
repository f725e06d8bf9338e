"""The optimizer-step contract over FSDP2 shards: fp16 loss scaling, the overflow verdict and the global norm.

:class:`ShardedAmpOptimizer` is :class:`~verl.utils.amp_optimizer.AmpOptimizer` for parameters that are ``DTensor``
shards (:func:`verl.utils.fsdp_utils.shard_model`). FSDP2 has already averaged the gradients over the ranks in its
backward (a reduce-scatter in fp32), so each rank holds the averaged gradient of its own shard only. The step then

1. unscales the local gradient shards by the dynamic loss scale (megatron-core's rule, :class:`DynamicLossScale`:
   floor, hysteresis, growth window);
2. checks its own shards for inf/NaN and agrees on the verdict with a MAX all-reduce, so an overflow that landed in
   one rank's shard skips the update on every rank;
3. computes the global gradient norm over all shards (local sums of squares, SUM all-reduced) and clips with it;
4. steps AdamW over the shards only when no rank found a non-finite gradient.

A skipped update never calls ``optimizer.step()``, so every shard, both Adam moments and Adam's step count stay bit
for bit what they were. The per-parameter optimizer state is sharded like the parameters and is checkpointed with
``torch.distributed.checkpoint`` (:mod:`verl.utils.fsdp_checkpoint`); :meth:`ShardedAmpOptimizer.state_dict` holds
only what is the same on every rank (hyper-parameters, loss scale).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from verl.utils.amp_optimizer import AmpOptimizer, LossScaleConfig, OptimConfig, adamw_kwargs, build_scheduler
from verl.utils.fsdp_utils import local_tensor

logger = logging.getLogger(__name__)


def comm_device(mesh: DeviceMesh) -> torch.device:
    """Where the tensors of this mesh's collectives must live (NCCL reduces only CUDA tensors)."""
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


class ShardedAmpOptimizer(AmpOptimizer):
    """``torch.optim`` over FSDP2 ``DTensor`` shards + optional fp16 loss scaling, with megatron-core's contract.

    Args:
        optimizer: the wrapped optimizer; every parameter must be a ``Shard(0)`` ``DTensor`` on ``mesh``.
        mesh: the 1-D data-parallel mesh the parameters are sharded over.
        clip_grad: max global gradient norm (<= 0 disables clipping; the norm is still computed).
        loss_scale: dynamic loss-scale settings, or None for fp32/bf16 (no scaling).
        offload_state: keep the optimizer state in CPU memory between steps (moved to the device for the step).

    Attributes:
        local_found_inf: whether this rank's own shards held a non-finite gradient at the last step, before the
            verdict was agreed; for diagnostics (the update decision is the agreed one).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        mesh: DeviceMesh,
        clip_grad: float = 1.0,
        loss_scale: LossScaleConfig | None = None,
        offload_state: bool = False,
    ):
        super().__init__(optimizer, clip_grad=clip_grad, loss_scale=loss_scale, process_group=mesh.get_group())
        for param in self.params:
            # the global norm adds the ranks' local sums of squares: only right when no element is held twice
            assert isinstance(param, DTensor) and all(isinstance(p, Shard) for p in param.placements), (
                "ShardedAmpOptimizer needs FSDP2-sharded parameters (Shard placements only)"
            )
        self.mesh = mesh
        self.comm_device = comm_device(mesh)
        self.offload_state = offload_state
        self.local_found_inf = False

    @torch.no_grad()
    def step(self) -> tuple[bool, float | None, int | None]:
        """Unscale, check (agreed over the ranks), measure and clip the gradient shards, then update unless
        any rank found a non-finite gradient.

        Returns:
            (update_successful, grad_norm, num_zeros_in_grad): grad_norm is the global norm before clipping (None
            when an fp16 update was skipped, as megatron-core reports it); zeros are not counted (None).
        """
        local_grads = [local_tensor(p.grad) for p in self.params if p.grad is not None]
        if self.loss_scale is not None and local_grads:
            torch._foreach_mul_(local_grads, 1.0 / self.loss_scale.scale)
        local_sum_sq = self._local_sum_of_squares(local_grads)
        self.local_found_inf = not bool(torch.isfinite(local_sum_sq))
        found_inf = torch.tensor([float(self.local_found_inf)], device=self.comm_device)
        # MAX: one rank's overflow is everyone's, so all ranks skip (or apply) the same update
        dist.all_reduce(found_inf, op=dist.ReduceOp.MAX, group=self.process_group)
        dist.all_reduce(local_sum_sq, op=dist.ReduceOp.SUM, group=self.process_group)
        successful = found_inf.item() == 0
        grad_norm = float(local_sum_sq.sqrt())
        if successful:
            self._clip(local_grads, grad_norm)
            self._optimizer_step()
        if self.loss_scale is not None:
            self.loss_scale.update(found_inf=not successful)
        if not successful:
            return False, (None if self.loss_scale is not None else grad_norm), None
        return True, grad_norm, None

    def _local_sum_of_squares(self, local_grads: list[torch.Tensor]) -> torch.Tensor:
        """Sum of squares of this rank's gradient elements, as a float32 (1,) tensor on the collective device."""
        if not local_grads:
            return torch.zeros(1, device=self.comm_device)
        norms = torch._foreach_norm(local_grads, 2.0)
        # inf or NaN anywhere in the shards makes this non-finite: the sum is the local overflow check too
        return torch.stack([n.float().to(self.comm_device) for n in norms]).square().sum().reshape(1)

    def _clip(self, local_grads: list[torch.Tensor], grad_norm: float) -> None:
        if self.clip_grad <= 0 or not local_grads:
            return
        # torch.nn.utils.clip_grads_with_norm_'s coefficient; scaling every shard by it clips the global norm
        clip_coef = self.clip_grad / (grad_norm + 1e-6)
        if clip_coef < 1.0:
            torch._foreach_mul_(local_grads, clip_coef)

    def _optimizer_step(self) -> None:
        if self.offload_state:
            self.move_state(self.comm_device)
        self.optimizer.step()
        if self.offload_state:
            self.move_state(torch.device("cpu"))

    def move_state(self, device: torch.device) -> None:
        """Move the per-parameter optimizer state (``DTensor`` shards and step counts) to ``device``.

        The copies are issued asynchronously; a copy from the GPU to the CPU is waited for before returning, since
        the CPU reads the state without a stream to order it (a save right after the step would read a partial copy).
        """
        for state in self.optimizer.state.values():
            for key, value in state.items():
                # Adam's scalar step count stays on the CPU unless it is a capturable/fused optimizer's
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    state[key] = value.to(device, non_blocking=True)
        if torch.device(device).type == "cpu" and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.current_stream().synchronize()

    # ------------------------------------------------------------------ state (the part every rank shares)

    def state_dict(self) -> dict[str, Any]:
        """Hyper-parameters of each param group (``lr``, betas, ...) and the loss scale; the moments are sharded
        and saved separately (:func:`verl.utils.fsdp_checkpoint.save_sharded`)."""
        groups = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        return {
            "param_groups": groups,
            "loss_scale": None if self.loss_scale is None else self.loss_scale.state_dict(),
            "loss_scale_config": None if self.loss_scale is None else asdict(self.loss_scale.config),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        groups = state["param_groups"]
        if len(groups) != len(self.optimizer.param_groups):
            raise ValueError(
                f"the checkpoint's optimizer has {len(groups)} param groups, this one "
                f"{len(self.optimizer.param_groups)}; resume with the model and optimizer settings of the run that "
                "wrote it."
            )
        for group, saved in zip(self.optimizer.param_groups, groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
        if self.loss_scale is not None and state.get("loss_scale") is not None:
            self.loss_scale.load_state_dict(state["loss_scale"])


def build_sharded_amp_optimizer(
    module: torch.nn.Module,
    optim: OptimConfig,
    *,
    mesh: DeviceMesh,
    dtype: torch.dtype,
    total_training_steps: int,
    optimizer_offload: bool,
    param_offload: bool,
    key: str,
):
    """AdamW over the shards of an FSDP2 module, wrapped in :class:`ShardedAmpOptimizer`, and its LR schedule.

    Args:
        module: the sharded module (:func:`verl.utils.fsdp_utils.shard_model`).
        optim: a validated ``optim`` section (:class:`~verl.workers.config.OptimConfig`).
        mesh: the mesh the module is sharded over.
        dtype: the compute dtype; float16 turns on the dynamic loss scale of ``optim``.
        total_training_steps: length of the LR schedule.
        optimizer_offload: ``fsdp_config.optimizer_offload``.
        param_offload: ``fsdp_config.param_offload`` (the state then lives with the parameters, in CPU memory).
        key: the model's ``fsdp_config`` key, for messages.

    Returns:
        (optimizer, lr_scheduler)
    """
    if optimizer_offload and (mesh.device_type == "cpu" or param_offload):
        # AdamW keeps its state where the parameters are: with CPUOffloadPolicy that is CPU memory, and the step
        # runs there (moving the state to the device would put it on another device than the parameters)
        logger.info("%s.optimizer_offload=true: the optimizer state is in CPU memory already", key)
        optimizer_offload = False
    adamw = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], **adamw_kwargs(optim))
    optimizer = ShardedAmpOptimizer(
        adamw,
        mesh=mesh,
        clip_grad=optim.clip_grad,
        loss_scale=optim.loss_scale() if dtype == torch.float16 else None,
        offload_state=optimizer_offload,
    )
    return optimizer, build_scheduler(adamw, optim, total_training_steps)
