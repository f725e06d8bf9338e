"""Typed configs: the schema of the YAML, validated once in the driver and handed to the workers.

The YAML files under ``verl/trainer/config`` hold every default; these frozen dataclasses have none. verl's class
names (``ActorConfig``, ``FSDPActorConfig``, ``OptimizerConfig``...; :mod:`verl.workers.config.verl_named`) are
subclasses of these sections that also take some keys by keyword and fill the rest from the YAML. Build the whole
config with :func:`compose_ppo_config` (what ``main_ppo`` does: :func:`compose_with_defaults`, then
:meth:`PPOConfig.from_omegaconf` with the file's defaults) and one section with :func:`load_section`. What follows
from a validated config (sizes, roles, log-prob passes, device, optimizers) is its :class:`RunPlan`
(:func:`build_run_plan`); the config itself is never changed.
"""

from verl.workers.config.actor import ActorConfig, FSDPActorConfig, McoreActorConfig
from verl.workers.config.algorithm import FilterGroupsConfig, OverlongBufferConfig
from verl.workers.config.critic import CriticConfig, FSDPCriticConfig, McoreCriticConfig
from verl.workers.config.engine import FSDPEngineConfig, McoreEngineConfig
from verl.workers.config.loading import (
    ComposedConfig,
    compose_omegaconf,
    compose_ppo_config,
    compose_with_defaults,
    load_section,
)
from verl.workers.config.model import HFModelConfig
from verl.workers.config.optim import LossScaleConfig, OptimConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig, McoreOptimizerConfig, OptimizerConfig
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
from verl.workers.config.reward import RewardConfig, RewardManagerConfig
from verl.workers.config.reward_model import SandboxFusionConfig
from verl.workers.config.roles import (
    DTYPES,
    STRATEGIES,
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
from verl.workers.config.rollout import EngineKwargsConfig, ValKwargsConfig
from verl.workers.config.schema import BaseConfig, FieldError, build_config
from verl.workers.config.verl_rollout import RolloutConfig

__all__ = [
    "DTYPES",
    "STRATEGIES",
    "ActorConfig",
    "FSDPActorConfig",
    "McoreActorConfig",
    "FSDPCriticConfig",
    "McoreCriticConfig",
    "FSDPEngineConfig",
    "McoreEngineConfig",
    "HFModelConfig",
    "OptimizerConfig",
    "FSDPOptimizerConfig",
    "McoreOptimizerConfig",
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
    "RewardConfig",
    "RewardManagerConfig",
    "RewardModelConfig",
    "SandboxFusionConfig",
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
