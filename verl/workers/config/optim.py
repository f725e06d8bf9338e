"""The ``optim`` section of a trained model (actor or critic): AdamW, its LR schedule, and fp16 loss scaling.

The loss-scale part follows megatron-core's ``OptimizerConfig`` names, so the ``dp`` adapter and megatron-core's
own optimizer start from the same scale and back off by the same rule (:meth:`OptimConfig.loss_scale`).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from verl.workers.config.schema import BaseConfig, FieldError, check_int, check_number

LR_SCHEDULERS = ("constant", "cosine")


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
    lr_scheduler: Literal["constant", "cosine"]
    min_lr_ratio: float
    initial_loss_scale: float
    min_loss_scale: float
    loss_scale_window: int
    hysteresis: int

    def check(self) -> None:
        check_number(self, "lr", 0.0, exclusive_min=True)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise FieldError("betas", f"must be two numbers in [0, 1), got {self.betas!r}.")
        check_number(self, "eps", 0.0, exclusive_min=True)
        check_number(self, "weight_decay", 0.0)
        check_number(self, "clip_grad")
        check_int(self, "lr_warmup_steps", 0)
        check_number(self, "min_lr_ratio", 0.0, 1.0)
        self.loss_scale()  # the loss-scale rules hold whatever the dtype: a bad value is a bad config

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
