"""The ``optim`` section of a trained model (actor or critic): AdamW, its LR schedule, and fp16 loss scaling.

The loss-scale part follows megatron-core's ``OptimizerConfig`` names, so the ``dp`` adapter and megatron-core's
own optimizer start from the same scale and back off by the same rule (:meth:`OptimConfig.loss_scale`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from verl.workers.config.schema import BaseConfig, FieldError, check_int, check_number

LR_SCHEDULERS = ("constant", "cosine")
# verl's names of the optimizer this project runs (torch.optim.AdamW; megatron-core's "adam" is AdamW too, with its
# default decoupled weight decay), compared case-insensitively
ADAMW_NAMES = ("adamw", "adam")
# verl's own keys for the schedule (FSDP optim, its older name, megatron optim): each means optim.lr_scheduler
VERL_SCHEDULER_KEYS = ("lr_scheduler_type", "warmup_style", "lr_decay_style")


@dataclasses.dataclass(frozen=True)
class LossScaleConfig(BaseConfig):
    """megatron-core's dynamic loss-scale settings.

    Attributes:
        initial_loss_scale: scale of the first step (megatron-core's default is 2**32).
        min_loss_scale: the floor the scale never goes below.
        loss_scale_window: clean steps in a row before the scale doubles.
        hysteresis: overflows tolerated before the scale halves; the count resets when the scale grows.
    """

    initial_loss_scale: float
    min_loss_scale: float
    loss_scale_window: int
    hysteresis: int

    def check(self) -> None:
        check_number(self, "initial_loss_scale", 0.0, exclusive_min=True)
        check_number(self, "min_loss_scale", 0.0, exclusive_min=True)
        if self.min_loss_scale > self.initial_loss_scale:
            raise FieldError(
                "min_loss_scale",
                f"({self.min_loss_scale}) must not exceed optim.initial_loss_scale ({self.initial_loss_scale}).",
            )
        check_int(self, "loss_scale_window", 1)
        check_int(self, "hysteresis", 1)


@dataclasses.dataclass(frozen=True)
class OptimConfig(BaseConfig):
    """AdamW, the LR schedule and (fp16 only) the dynamic loss scale; see ``ppo_trainer.yaml`` for each key."""

    lr: float
    betas: list[float]
    eps: float
    weight_decay: float
    clip_grad: float
    lr_warmup_steps: int
    lr_warmup_steps_ratio: float
    lr_scheduler: Literal["constant", "cosine"]
    lr_scheduler_type: str | None
    warmup_style: str | None
    lr_decay_style: str | None
    # null (the default of verl's FSDPOptimizerConfig class) is 0, as verl's cosine schedule reads it
    min_lr_ratio: float | None
    num_cycles: float
    # verl's megatron spelling of the floor of the cosine schedule, as a learning rate (0: none); see floor_ratio()
    min_lr: float
    # verl's optimizer name: AdamW (verl's FSDP default) or adam (verl's megatron default, AdamW there too) only
    optimizer: str
    # verl's megatron length of the LR decay, in training steps; null: the run's training steps. See decay_steps()
    lr_decay_steps: int | None
    initial_loss_scale: float
    min_loss_scale: float
    loss_scale_window: int
    hysteresis: int
    # megatron-core OptimizerConfig fields (strategy megatron); checked in verl.workers.config.megatron
    override_optimizer_config: Any

    def check(self) -> None:
        check_number(self, "lr", 0.0, exclusive_min=True)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise FieldError("betas", f"must be two numbers in [0, 1), got {self.betas!r}.")
        check_number(self, "eps", 0.0, exclusive_min=True)
        check_number(self, "weight_decay", 0.0)
        check_number(self, "clip_grad")
        check_int(self, "lr_warmup_steps", -1)
        check_number(self, "lr_warmup_steps_ratio", 0.0, 1.0)
        check_number(self, "min_lr_ratio", 0.0, 1.0)
        check_number(self, "num_cycles", 0.0, exclusive_min=True)
        self._check_optimizer_name()
        check_int(self, "lr_decay_steps", 1)
        self.floor_ratio()
        self.scheduler_name()
        self.loss_scale()  # the loss-scale rules hold whatever the dtype: a bad value is a bad config

    def _check_optimizer_name(self) -> None:
        if str(self.optimizer).lower() not in ADAMW_NAMES:
            raise FieldError(
                "optimizer",
                f"={self.optimizer!r}: this project trains with AdamW only (verl's AdamW / adam); other optimizers "
                "(verl's torch.optim / megatron-core choices) are not built here. Set it to AdamW.",
            )

    def floor_ratio(self) -> float:
        """Where the cosine schedule ends, as a share of ``lr``: ``min_lr_ratio``, or ``min_lr / lr`` when verl's
        ``min_lr`` is set instead (the two are one setting; both set and disagreeing is refused)."""
        check_number(self, "min_lr", 0.0, self.lr)
        if not self.min_lr:
            return self.min_lr_ratio or 0.0
        ratio = self.min_lr / self.lr
        if self.min_lr_ratio and abs(self.min_lr_ratio - ratio) > 1e-12:
            raise FieldError(
                "min_lr",
                f"={self.min_lr} (a floor of {ratio:g} x lr) disagrees with optim.min_lr_ratio={self.min_lr_ratio}; "
                "they are one setting (the cosine schedule's floor): set one of them.",
            )
        return ratio

    def scheduler_name(self) -> str:
        """The schedule after warm-up: ``lr_scheduler``, or the one verl's own key names (the same value)."""
        named = {key: getattr(self, key) for key in VERL_SCHEDULER_KEYS if getattr(self, key) is not None}
        for key, value in named.items():
            if value not in LR_SCHEDULERS:
                raise FieldError(
                    key,
                    f"={value!r} is a verl LR schedule this project does not have; use one of {list(LR_SCHEDULERS)} "
                    "(or set it to null and use optim.lr_scheduler).",
                )
        values = set(named.values())
        if len(values) > 1 or (values and self.lr_scheduler not in values and self.lr_scheduler != "constant"):
            raise FieldError(
                next(iter(named)),
                f"names the schedule {sorted(values)} while optim.lr_scheduler={self.lr_scheduler!r}; these keys are "
                "one setting, set one of them.",
            )
        return values.pop() if values else self.lr_scheduler

    def num_warmup_steps(self, total_training_steps: int) -> int:
        """Warm-up steps: ``lr_warmup_steps``, or (when it is -1, verl's default) ``lr_warmup_steps_ratio`` of
        the run's ``total_training_steps``, rounded down as verl does."""
        if self.lr_warmup_steps >= 0:
            return self.lr_warmup_steps
        return int(self.lr_warmup_steps_ratio * total_training_steps)

    def decay_steps(self, total_training_steps: int) -> int:
        """Steps over which the schedule comes down to its floor (warm-up included), after which the LR stays
        there: verl's ``lr_decay_steps``, or the run's ``total_training_steps`` when it is null."""
        return total_training_steps if self.lr_decay_steps is None else self.lr_decay_steps

    def loss_scale(self) -> LossScaleConfig:
        """The dynamic loss-scale settings of this section."""
        try:
            return LossScaleConfig(
                initial_loss_scale=self.initial_loss_scale,
                min_loss_scale=self.min_loss_scale,
                loss_scale_window=self.loss_scale_window,
                hysteresis=self.hysteresis,
            )
        except FieldError as err:
            raise FieldError(err.field, err.detail) from None
