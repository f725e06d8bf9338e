"""The LoRA keys of ``actor_rollout_ref.model`` and their rules: verl's dp/FSDP form (``lora_rank``, ``lora_alpha``,
``target_modules``, ``exclude_modules``, ``lora_adapter_path``) and its megatron form (``model.lora.*``).

:func:`check_lora_fields` holds the rules of the model section alone; :func:`check_lora` those that read other
sections (the strategy, the fused kernels) and, when LoRA is on, injects the adapters into an empty
(meta-device) copy of the model, so that a ``target_modules`` matching nothing or a rank wider than a layer fails at
start-up naming the key, not inside a Ray worker (see :mod:`verl.utils.lora`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from verl.workers.config.schema import BaseConfig, FieldError, check_int, check_number

KEY = "actor_rollout_ref.model"
MEGATRON_REFUSAL = "LoRA is not supported on the megatron backend yet"


@dataclasses.dataclass(frozen=True)
class MegatronLoraConfig(BaseConfig):
    """``actor_rollout_ref.model.lora``: verl's megatron-form LoRA (Megatron-Bridge), accepted with ``rank: 0``."""

    type: str
    merge: bool
    rank: int
    alpha: float
    dropout: float
    target_modules: list[str]
    exclude_modules: list[str]
    dropout_position: str
    lora_A_init_method: str
    lora_B_init_method: str
    a2a_experimental: bool
    dtype: str | None
    adapter_path: str | None
    freeze_vision_model: bool
    freeze_vision_projection: bool
    freeze_language_model: bool

    def check(self) -> None:
        check_int(self, "rank", 0)


def check_lora_fields(model: Any) -> None:
    """Rules of ``actor_rollout_ref.model``'s LoRA keys that need no other section."""
    check_int(model, "lora_rank", 0)
    check_number(model, "lora_alpha", 0, exclusive_min=True)
    targets = model.target_modules
    if not targets or (isinstance(targets, list) and not all(targets)):
        raise FieldError(
            "target_modules", f"={targets!r} names no module; use all-linear or a list of linear layer names."
        )
    path = model.lora_adapter_path
    if path and not (Path(path) / "adapter_config.json").is_file():
        raise FieldError(
            "lora_adapter_path",
            f"={path!r} is not a peft adapter directory (no adapter_config.json there); point it at a directory "
            "written by peft's save_pretrained, e.g. a checkpoint's actor/lora_adapter.",
        )


def check_lora(config: Any) -> None:
    """Rules of LoRA that read other sections of the whole config (a :class:`PPOConfig`).

    Raises:
        ValueError: LoRA on the megatron backend, with the fused head on a targeted output layer, the megatron
            form on dp/fsdp, or targets/rank that do not fit the model.
    """
    _check_critic_lora(config)
    arr = config.actor_rollout_ref
    model, strategy = arr.model, arr.actor.strategy
    if strategy == "megatron" and (model.uses_lora or model.lora.rank):
        if model.lora.rank:
            which, value = "lora.rank", model.lora.rank
        elif model.lora_rank:
            which, value = "lora_rank", model.lora_rank
        else:
            which, value = "lora_adapter_path", model.lora_adapter_path
        raise ValueError(
            f"{KEY}.{which}={value}: {MEGATRON_REFUSAL}; train LoRA with actor_rollout_ref.actor.strategy=fsdp "
            f"(or dp), or unset {KEY}.{which}."
        )
    if model.lora.rank:
        raise ValueError(
            f"{KEY}.lora.rank={model.lora.rank} is verl's megatron form of LoRA, and this run trains with "
            f"strategy={strategy}; set {KEY}.lora_rank (and lora_alpha, target_modules) instead."
        )
    if not model.lora_rank or model.lora_adapter_path:  # an adapter from a directory brings its own targets
        return
    targets = model.target_modules if isinstance(model.target_modules, list) else [model.target_modules]
    if model.use_fused_kernels and "lm_head" in targets:
        raise ValueError(
            f"{KEY}.target_modules includes lm_head and use_fused_kernels=true: the fused head reads the output "
            "layer's base weight and would skip its adapter; leave lm_head out of target_modules or set "
            "use_fused_kernels=false."
        )
    from verl.utils.lora import check_lora_targets

    check_lora_targets(model, key=KEY)


def _check_critic_lora(config: Any) -> None:
    """``critic.model.lora_rank > 0``: adapters on the value model's backbone (dp and fsdp2), its value head trained
    whole; refused on megatron; targets and rank checked on an empty copy of the critic's model."""
    critic = config.critic.model
    if not (config.needs_critic and critic.lora_rank):
        return
    if config.critic_strategy == "megatron":
        raise ValueError(
            f"critic.model.lora_rank={critic.lora_rank}: {MEGATRON_REFUSAL}; train the critic with "
            "critic.strategy=fsdp (or dp), or set critic.model.lora_rank=0."
        )
    from verl.utils.lora import check_lora_targets

    check_lora_targets(critic, key="critic.model")
