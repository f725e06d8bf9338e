"""``model_engine``: verl's top-level choice of training engine, which selects the actor, reference and critic
component files of ``ppo_trainer.yaml``'s defaults list (``${model_engine}_actor`` ...).

Two engines are built here: ``dp`` (the data-parallel PyTorch backends: ``actor_rollout_ref.actor.strategy`` fsdp,
fsdp2 or dp; the default) and ``megatron`` (megatron-core). verl's other engines (VeOmni, TorchTitan, AutoModel) are
refused by name (:mod:`verl.workers.config.out_of_scope`). ``model_engine=megatron`` puts the actor on megatron-core;
an actor strategy of another backend next to it contradicts it. With ``dp`` (the default) the actor's strategy may
still be set to megatron on its own, the older form (``actor_rollout_ref.actor.strategy=megatron``): the dp
components carry the megatron section too.
"""

from __future__ import annotations

from typing import Any

from verl.workers.config.out_of_scope import model_engine_message
from verl.workers.config.schema import FieldError

# The engines built here, and the actor strategies each one trains with.
MODEL_ENGINE_STRATEGIES: dict[str, tuple[str, ...]] = {
    "dp": ("fsdp", "fsdp2", "dp", "megatron"),
    "megatron": ("megatron",),
}


def check_model_engine(model_engine: Any, actor_strategy: str) -> None:
    """Refuse an engine not built here (verl's out-of-scope ones by name) and an actor strategy that contradicts it.

    Raises:
        FieldError: on ``model_engine``, with what to set instead.
    """
    refusal = model_engine_message(model_engine)
    if refusal is not None:
        raise FieldError("model_engine", refusal.removeprefix("model_engine"))
    if model_engine not in MODEL_ENGINE_STRATEGIES:
        raise FieldError("model_engine", f"={model_engine!r} is not an engine: dp | megatron.")
    if actor_strategy not in MODEL_ENGINE_STRATEGIES[model_engine]:
        raise FieldError(
            "model_engine",
            f"={model_engine} trains the actor on megatron-core, but actor_rollout_ref.actor.strategy={actor_strategy} "
            "names another backend. Set one of them: model_engine=megatron alone (its actor file sets strategy "
            f"megatron), or model_engine=dp with actor_rollout_ref.actor.strategy={actor_strategy}.",
        )
