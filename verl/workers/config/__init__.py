"""Typed configs: the schema of the YAML, validated once in the driver and handed to the workers.

The YAML files under ``verl/trainer/config`` hold every default; these frozen dataclasses have none. Build the whole
config with :func:`compose_ppo_config` (what ``main_ppo`` does: :func:`compose_with_defaults`, then
:meth:`PPOConfig.from_omegaconf` with the file's defaults) and one section with :func:`load_section`.
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
    "TrainedModelConfig",
    "TrainerConfig",
    "ValKwargsConfig",
    "build_config",
    "compose_omegaconf",
    "compose_ppo_config",
    "compose_with_defaults",
    "load_section",
]
