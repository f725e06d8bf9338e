"""verl's model config class name (``verl.workers.config.model.HFModelConfig``) over ``actor_rollout_ref.model``.

``HFModelConfig(path="Qwen/Qwen2.5-0.5B")`` is the model section of the YAML with that key changed
(:mod:`verl.workers.config.verl_named`). Unlike verl's, it does not load the Hugging Face config or tokenizer
when built; this package loads them where the model is built (:mod:`verl.models.loading`).
"""

from __future__ import annotations

from verl.workers.config import roles
from verl.workers.config.verl_named import VerlNamedConfig, verl_named

__all__ = ["HFModelConfig"]


@verl_named()
class HFModelConfig(roles.ModelConfig, VerlNamedConfig):
    """``actor_rollout_ref.model`` under verl's name."""
