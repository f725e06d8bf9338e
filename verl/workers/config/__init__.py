"""Typed configs: the schema of the YAML, validated once in the driver and handed to the workers.

The YAML files under ``verl/trainer/config`` hold every default; these frozen dataclasses have none. Build the whole
config with :meth:`PPOConfig.from_omegaconf` (what ``main_ppo`` does) or :func:`compose_ppo_config`, and one
section with :func:`load_section`.
"""

from verl.workers.config.loading import compose_omegaconf, compose_ppo_config, load_section
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
    "LossScaleConfig",
    "MegatronConfig",
    "ModelConfig",
    "OptimConfig",
    "PPOConfig",
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
    "load_section",
]
