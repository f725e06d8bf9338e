"""verl's engine config classes (``verl.workers.config.engine``): the FSDP and megatron settings of a role.

``FSDPEngineConfig(param_offload=True)`` is the actor's ``fsdp_config`` section of the YAML with that key changed;
``McoreEngineConfig(tensor_model_parallel_size=2)`` the actor's ``megatron`` section of
``ppo_megatron_trainer.yaml`` (:mod:`verl.workers.config.verl_named`). As in verl, ``sequence_parallel`` reads
false with one tensor-parallel rank (there is nothing to split; this package applies it only from two ranks on)
and stays assignable.
"""

from __future__ import annotations

from typing import Any

from verl.workers.config import roles
from verl.workers.config.megatron import MegatronConfig
from verl.workers.config.verl_named import VerlNamedConfig, verl_named

__all__ = ["FSDPEngineConfig", "McoreEngineConfig"]


@verl_named(section="actor_rollout_ref.actor.fsdp_config")
class FSDPEngineConfig(roles.FSDPConfig, VerlNamedConfig):
    """``<role>.fsdp_config`` under verl's name; the actor's defaults."""


@verl_named(
    section="actor_rollout_ref.actor.megatron", defaults_from="ppo_megatron_trainer", mutable=("sequence_parallel",)
)
class McoreEngineConfig(MegatronConfig, VerlNamedConfig):
    """``<role>.megatron`` under verl's name; the megatron actor's defaults."""

    @classmethod
    def verl_normalise(cls, values: dict[str, Any], given: set[str]) -> None:
        if values["tensor_model_parallel_size"] == 1:
            values["sequence_parallel"] = False
