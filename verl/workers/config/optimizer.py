"""verl's optimizer config classes (``verl.workers.config.optimizer``) over this package's ``optim`` section.

``OptimizerConfig(lr=1e-5)`` is the actor's ``optim`` section of the YAML with ``lr`` changed (see
:mod:`verl.workers.config.verl_named` for how the other keys are filled). verl's schedule keys are one setting
here: ``lr_scheduler_type`` (verl's name), ``warmup_style`` (its older name) and this package's ``lr_scheduler``
always name the same schedule on these classes, whichever of them was given. Where verl's class gives a key another
default than verl's YAML, the class keeps verl's class default when the key is not given: ``min_lr_ratio`` None on
``FSDPOptimizerConfig`` (the cosine schedule reads it as 0, as verl's does) and ``optimizer`` "adam" on
``McoreOptimizerConfig`` (megatron-core's name of the same AdamW).
"""

from __future__ import annotations

from typing import Any

from verl.workers.config.optim import OptimConfig
from verl.workers.config.verl_named import VerlNamedConfig, verl_named

__all__ = ["FSDPOptimizerConfig", "McoreOptimizerConfig", "OptimizerConfig"]

_SCHEDULE_KEYS = ("lr_scheduler_type", "warmup_style", "lr_scheduler")


@verl_named(section="actor_rollout_ref.actor.optim")
class OptimizerConfig(OptimConfig, VerlNamedConfig):
    """``<role>.optim`` under verl's name; the actor's defaults."""

    @classmethod
    def verl_normalise(cls, values: dict[str, Any], given: set[str]) -> None:
        chosen = [values[key] for key in _SCHEDULE_KEYS if key in given and values[key] is not None]
        if len(set(chosen)) > 1:
            raise ValueError(
                f"{cls.VERL_SECTION}: lr_scheduler_type, warmup_style and lr_scheduler name one schedule; "
                f"got {chosen}. Set one."
            )
        schedule = chosen[0] if chosen else values["lr_scheduler"]
        values["lr_scheduler_type"] = schedule
        values["lr_scheduler"] = schedule
        if values["warmup_style"] is not None:
            values["warmup_style"] = schedule


@verl_named(fixed={"min_lr_ratio": None})
class FSDPOptimizerConfig(OptimizerConfig):
    """The optimizer of the FSDP (and plain data-parallel) backends."""


@verl_named(defaults_from="ppo_megatron_trainer", fixed={"optimizer": "adam"})
class McoreOptimizerConfig(OptimizerConfig):
    """The optimizer of the megatron backend; the defaults of ``ppo_megatron_trainer.yaml``."""
