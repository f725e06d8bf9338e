"""verl's rollout config class name (``verl.workers.config.RolloutConfig``) over ``actor_rollout_ref.rollout``.

``RolloutConfig(name="vllm", n=4, temperature=0.7)`` is the rollout section of the YAML with those keys changed
(:mod:`verl.workers.config.verl_named`). This package's section class of the same name stays in
:mod:`verl.workers.config.rollout` (built from the YAML, no keyword defaults); ``from verl.workers.config import
RolloutConfig`` gives this one, which also counts a section built from the YAML as its instance.
"""

from __future__ import annotations

from verl.workers.config import rollout
from verl.workers.config.verl_named import VerlNamedConfig, verl_named

__all__ = ["RolloutConfig"]


@verl_named()
class RolloutConfig(rollout.RolloutConfig, VerlNamedConfig):
    """``actor_rollout_ref.rollout`` under verl's name."""
