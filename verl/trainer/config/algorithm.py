"""verl's import path of the algorithm config classes: ``from verl.trainer.config.algorithm import ...``.

The classes live in :mod:`verl.workers.config`; this module names them where verl users' code imports them, so
that ``RolloutCorrectionConfig.decoupled_seq_is()`` and the other presets port unchanged.
"""

from verl.workers.config.algorithm import FilterGroupsConfig, RolloutCorrectionConfig
from verl.workers.config.ppo import AlgorithmConfig, KLControlConfig

__all__ = ["AlgorithmConfig", "FilterGroupsConfig", "KLControlConfig", "RolloutCorrectionConfig"]
