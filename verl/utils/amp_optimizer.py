"""A torch.optim optimizer behind megatron-core's optimizer-step contract, with fp16 dynamic loss scaling.

megatron-core's ``MegatronOptimizer.step()`` returns ``(update_successful, grad_norm, num_zeros_in_grad)`` and
exposes ``get_loss_scale()``; both actors end every mini-batch by reading exactly that. :class:`AmpOptimizer` gives
a plain ``torch.optim`` optimizer the same interface, so the ``dp`` actor and the CPU path of the ``megatron`` actor
share one step contract with megatron-core's own optimizer on GPU.

fp16 uses ``torch.amp.GradScaler`` to scale the loss and to unscale and check the gradients in one fused pass. The
scale itself follows megatron-core's dynamic rule, which GradScaler lacks two parts of: a floor (``min_loss_scale``;
without one the scale decays towards zero and the run stalls silently) and hysteresis (the number of overflows
tolerated before backing off). A skipped update leaves the weights, the moments and the optimizer's step count
untouched, because ``optimizer.step()`` is simply not called. With several data-parallel ranks the gradients are
averaged before the check and the verdict is all-reduced, so every rank takes the same decision.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from verl.utils.config import cfg_get


@dataclass
class LossScaleConfig:
    """megatron-core's dynamic loss-scale settings (``OptimizerConfig`` uses the same names).

    Attributes:
        initial_loss_scale: scale of the first step (megatron-core's default is 2**32).
        min_loss_scale: the floor the scale never goes below.
        loss_scale_window: clean steps in a row before the scale doubles.
        hysteresis: overflows tolerated before the scale halves; the count resets when the scale grows.
    """

    initial_loss_scale: float = 2.0**32
    min_loss_scale: float = 1.0
    loss_scale_window: int = 1000
    hysteresis: int = 2

    def __post_init__(self):
        if not self.initial_loss_scale > 0 or not self.min_loss_scale > 0:
            raise ValueError(
                f"optim.initial_loss_scale and optim.min_loss_scale must be > 0, got {self.initial_loss_scale} and "
                f"{self.min_loss_scale}."
            )
        if self.min_loss_scale > self.initial_loss_scale:
            raise ValueError(
                f"optim.min_loss_scale ({self.min_loss_scale}) must not exceed optim.initial_loss_scale "
                f"({self.initial_loss_scale})."
            )
        for key in ("loss_scale_window", "hysteresis"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"optim.{key} must be an integer >= 1, got {value!r}.")


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
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        clip_grad: float = 1.0,
        loss_scale: LossScaleConfig | None = None,
        process_group: Any = None,
    ):
        self.optimizer = optimizer
        self.clip_grad = float(clip_grad)
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.process_group = process_group
        self.loss_scale = DynamicLossScale(loss_scale) if loss_scale is not None else None
        self.grad_scaler = None
        if self.loss_scale is not None:
            device = self.params[0].device.type
            self.grad_scaler = torch.amp.GradScaler(device, init_scale=self.loss_scale.scale)

    # ------------------------------------------------------------------ the megatron-core interface

    def get_loss_scale(self) -> float | None:
        """The scale the next backward pass uses; None without loss scaling."""
        return None if self.loss_scale is None else self.loss_scale.scale

    @property
    def min_loss_scale(self) -> float | None:
        return None if self.loss_scale is None else self.loss_scale.config.min_loss_scale

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss if self.grad_scaler is None else self.grad_scaler.scale(loss)

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
        found_inf = torch.zeros((), dtype=torch.float32, device=self.params[0].device)
        if self.grad_scaler is not None:
            self.grad_scaler.unscale_(self.optimizer)
            for flag in self.grad_scaler._per_optimizer_states[id(self.optimizer)]["found_inf_per_device"].values():
                found_inf += flag.to(found_inf.device)
        grads = [p for p in self.params if p.grad is not None]
        max_norm = self.clip_grad if self.clip_grad > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(grads, max_norm) if grads else torch.zeros(())
        verdict = torch.stack([found_inf, (~torch.isfinite(grad_norm)).float(), grad_norm.float()])
        if world > 1:  # gradients are already averaged; this makes the decision identical even if one rank errs
            flags = verdict[:2].clone()
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.process_group)
            verdict[:2] = flags
        found_inf_flag, nonfinite_norm, norm_value = verdict.tolist()
        successful = not (found_inf_flag > 0 or nonfinite_norm > 0)
        if successful:
            self.optimizer.step()
        if self.loss_scale is not None:
            self.loss_scale.update(found_inf=not successful)
            self.grad_scaler.update(new_scale=self.loss_scale.scale)
        if not successful:
            return False, (None if self.grad_scaler is not None else norm_value), None
        return True, norm_value, None

    # ------------------------------------------------------------------ helpers and state

    def _world_size(self) -> int:
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self.process_group)

    def _all_reduce_grads(self, world: int) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.process_group)
        flat /= world
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

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
            self.grad_scaler = torch.amp.GradScaler(self.params[0].device.type, init_scale=self.loss_scale.scale)

    @property
    def param_groups(self):
        return self.optimizer.param_groups


def loss_scale_config_from(optim_config: Any) -> LossScaleConfig:
    """The fp16 loss-scale settings of an ``optim`` config section (missing keys take megatron-core's defaults)."""

    def get(key, default=None):
        return cfg_get(optim_config, key, default)

    defaults = LossScaleConfig()

    def value(key):
        # Only a missing or null key takes the default: 0 or a negative number reaches LossScaleConfig's checks.
        found = get(key, None)
        return getattr(defaults, key) if found is None else found

    return LossScaleConfig(
        initial_loss_scale=float(value("initial_loss_scale")),
        min_loss_scale=float(value("min_loss_scale")),
        loss_scale_window=value("loss_scale_window"),
        hysteresis=value("hysteresis"),
    )


def build_amp_optimizer(
    params, optim_config: Any, *, dtype: torch.dtype, total_training_steps: int, process_group: Any = None
):
    """AdamW wrapped in :class:`AmpOptimizer`, and its LR schedule, from an ``optim`` config section.

    Returns:
        (optimizer, lr_scheduler)
    """
    from verl.utils.torch_functional import build_lr_scheduler

    def get(key, default=None):
        return cfg_get(optim_config, key, default)

    lr = float(get("lr", 1e-6))
    if not lr > 0:
        raise ValueError(f"optim.lr must be > 0, got {lr}.")
    betas = tuple(get("betas", None) or (0.9, 0.999))
    adamw = torch.optim.AdamW(
        list(params), lr=lr, betas=betas, weight_decay=float(get("weight_decay", 0.01)), eps=float(get("eps", 1e-8))
    )
    loss_scale = loss_scale_config_from(optim_config) if dtype == torch.float16 else None
    optimizer = AmpOptimizer(
        adamw, clip_grad=float(get("clip_grad", 1.0)), loss_scale=loss_scale, process_group=process_group
    )
    warmup = int(get("lr_warmup_steps", 0) or 0)
    if warmup < 0:
        raise ValueError(f"optim.lr_warmup_steps must be >= 0, got {warmup}.")
    scheduler = build_lr_scheduler(
        adamw,
        get("lr_scheduler", "constant"),
        num_warmup_steps=warmup,
        num_training_steps=max(total_training_steps, 1),
        min_lr_ratio=float(get("min_lr_ratio", 0.0) or 0.0),
    )
    return optimizer, scheduler
