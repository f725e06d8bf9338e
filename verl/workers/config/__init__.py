"""Typed configs: the schema of the YAML, validated once in the driver and handed to the workers.

The YAML files under ``verl/trainer/config`` hold every default; these frozen dataclasses have none. Build the whole
config with :func:`compose_ppo_config` (what ``main_ppo`` does: :func:`compose_with_defaults`, then
:meth:`PPOConfig.from_omegaconf` with the file's defaults) and one section with :func:`load_section`. What follows
from a validated config (sizes, roles, log-prob passes, device, optimizers) is its :class:`RunPlan`
(:func:`build_run_plan`); the config itself is never changed.
"""

from verl.workers.config.algorithm import FilterGroupsConfig, OverlongBufferConfig
from verl.workers.config.loading import (
    ComposedConfig,
    compose_omegaconf,
    compose_ppo_config,
    compose_with_defaults,
    load_section,
)
from verl.workers.config.optim import LossScaleConfig, OptimConfig
from verl.workers.config.plan import RunPlan, build_run_plan, resolve_device
from verl.workers.config.ppo import (
    ActorRolloutRefConfig,
    AlgorithmConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    KLControlConfig,
    PPOConfig,
    RayInitConfig,
    RewardModelConfig,
    RolloutCorrectionConfig,
    TrainerConfig,
)
from verl.workers.config.roles import (
    DTYPES,
    STRATEGIES,
    ActorConfig,
    CriticConfig,
    CriticModelConfig,
    FaultInjectionConfig,
    FSDPConfig,
    MegatronConfig,
    MicroBatching,
    ModelConfig,
    PolicyLossConfig,
    RefConfig,
    RefFSDPConfig,
    TrainedModelConfig,
    WrapPolicyConfig,
)
from verl.workers.config.rollout import EngineKwargsConfig, RolloutConfig, ValKwargsConfig
from verl.workers.config.schema import BaseConfig, FieldError, build_config

__all__ = [
    "DTYPES",
    "STRATEGIES",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "BaseConfig",
    "ComposedConfig",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "EngineKwargsConfig",
    "FSDPConfig",
    "KLControlConfig",
    "MicroBatching",
    "RefFSDPConfig",
    "RolloutCorrectionConfig",
    "WrapPolicyConfig",
    "FaultInjectionConfig",
    "FieldError",
    "FilterGroupsConfig",
    "OverlongBufferConfig",
    "LossScaleConfig",
    "MegatronConfig",
    "ModelConfig",
    "OptimConfig",
    "PPOConfig",
    "PolicyLossConfig",
    "RayInitConfig",
    "RefConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "RunPlan",
    "TrainedModelConfig",
    "TrainerConfig",
    "ValKwargsConfig",
    "build_config",
    "build_run_plan",
    "compose_omegaconf",
    "compose_ppo_config",
    "compose_with_defaults",
    "load_section",
    "resolve_device",
]
