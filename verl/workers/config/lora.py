"""The LoRA keys of ``actor_rollout_ref.model`` and their rules: verl's dp/FSDP form (``lora_rank``, ``lora_alpha``,
``target_modules``, ``exclude_modules``, ``lora_adapter_path``) and its megatron form (``model.lora.*``).

:func:`check_lora_fields` holds the rules of the model section alone; :func:`check_lora` those that read other
sections (the strategy, the fused kernels) and, when LoRA is on, injects the adapters into an empty
(meta-device) copy of the model, so that a ``target_modules`` matching nothing or a rank wider than a layer fails at
start-up naming the key, not inside a Ray worker (see :mod:`verl.utils.lora`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from verl.workers.config.schema import BaseConfig, FieldError, check_int, check_number, check_one_of

KEY = "actor_rollout_ref.model"
# verl's megatron LoRA kinds this project does not build: what each would need.
_OTHER_KINDS = {
    "vlm_lora": "adapters on a vision-language model (multimodal models are out of scope)",
    "canonical_lora": "separate adapters on the q, k, v and gate, up projections inside the fused layers",
    "dora": "weight-decomposed adapters (DoRA)",
}


@dataclasses.dataclass(frozen=True)
class MegatronLoraConfig(BaseConfig):
    """``actor_rollout_ref.model.lora`` and ``critic.model.lora``: verl's megatron-form LoRA, adapters on the megatron
    actor's or critic's linear layers (:mod:`verl.models.mcore.lora`); ``rank: 0`` is off."""

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
        if not self.rank:
            return
        # megatron-core is imported only for a megatron LoRA config (a dp/fsdp run need not have it)
        from verl.models.mcore.lora import COLUMN_PARALLEL, INIT_METHODS, ROW_PARALLEL

        if self.type != "lora":
            reason = _OTHER_KINDS.get(self.type, "an adapter kind this project does not know")
            raise FieldError("type", f"={self.type!r}: {reason}, not built here. Use type=lora.")
        check_number(self, "alpha", 0, exclusive_min=True)
        if not 0.0 <= self.dropout < 1.0:
            raise FieldError("dropout", f"={self.dropout!r} must be in [0, 1).")
        check_one_of(self, "dropout_position", ("pre", "post"), "dropout positions")
        check_one_of(self, "lora_A_init_method", INIT_METHODS, "initialisations")
        check_one_of(self, "lora_B_init_method", INIT_METHODS, "initialisations")
        kinds = [*COLUMN_PARALLEL, *ROW_PARALLEL]
        unknown = [name for name in self.target_modules if name not in kinds]
        if unknown or not self.target_modules:
            raise FieldError(
                "target_modules", f"={list(self.target_modules)!r}: take megatron-core linear layers from {kinds}."
            )
        refuse = {
            "a2a_experimental": "Megatron-Bridge's all-to-all exchange of expert adapters (MoE models are out of "
            "scope); set it to false",
            "adapter_path": "megatron adapters are saved and resumed inside this project's checkpoints "
            "(trainer.resume_mode); starting from Megatron-Bridge's adapter files is not built. Set it to null",
            "dtype": "the adapters take the dtype of the layer they adapt (the master weights' on the CPU path). "
            "Set it to null",
        }
        for name, why in refuse.items():
            if getattr(self, name):
                raise FieldError(name, f"={getattr(self, name)!r}: {why}.")
        if not self.freeze_language_model:
            raise FieldError(
                "freeze_language_model",
                "=false would train the base weights beside the adapters; LoRA here trains the adapters alone. "
                "Set it to true, or train fully with lora.rank=0.",
            )


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
    if path:
        _check_saved_adapter(Path(path) / "adapter_config.json")


# Options of a saved peft adapter whose weights the merge for the rollout and the export cannot give (see
# verl.utils.lora._check_mergeable, which checks the loaded adapter again, layer by layer).
_UNMERGEABLE_ADAPTER_OPTIONS = {
    "use_dora": "DoRA (its magnitude vector rescales the merged weight)",
    "modules_to_save": "whole trained copies of layers (modules_to_save)",
    "lora_bias": "adapter biases (lora_bias)",
}


def _check_saved_adapter(config_file: Path) -> None:
    try:
        saved = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        raise FieldError("lora_adapter_path", f": {config_file} cannot be read as JSON ({err}).") from None
    for option, what in _UNMERGEABLE_ADAPTER_OPTIONS.items():
        if saved.get(option):
            raise FieldError(
                "lora_adapter_path",
                f": the adapter's {option}={saved[option]!r} means {what}, which is not merged into the weights the "
                "rollout samples with here; use a plain LoRA adapter.",
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
    if strategy == "megatron":
        if model.uses_lora:
            which, value = (
                ("lora_rank", model.lora_rank) if model.lora_rank else ("lora_adapter_path", model.lora_adapter_path)
            )
            raise ValueError(
                f"{KEY}.{which}={value} is the dp/fsdp form of LoRA (peft, Hugging Face layer names); the megatron "
                f"actor takes verl's megatron form: set {KEY}.lora.rank (lora.alpha, lora.target_modules over "
                "linear_qkv, linear_proj, linear_fc1, linear_fc2) instead."
            )
        if model.lora.rank:
            _check_megatron_rank_fits(model)
        return
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
    from verl.models.lora_targets import check_lora_targets

    check_lora_targets(model, key=KEY)


def _check_critic_lora(config: Any) -> None:
    """The critic's LoRA: the dp/fsdp form (``critic.model.lora_rank``, peft adapters on the value model's backbone)
    on dp and fsdp2, the megatron form (``critic.model.lora.*``) on megatron, each with the whole value head
    trained and the base weights frozen; targets and rank checked against the critic's model."""
    if not config.needs_critic:
        return
    critic, key = config.critic.model, "critic.model"
    if config.critic_strategy == "megatron":
        if critic.lora_rank:
            raise ValueError(
                f"{key}.lora_rank={critic.lora_rank} is the dp/fsdp form of LoRA (peft, Hugging Face layer names); "
                f"the megatron critic takes verl's megatron form: set {key}.lora.rank (lora.alpha, "
                "lora.target_modules over linear_qkv, linear_proj, linear_fc1, linear_fc2) instead."
            )
        if critic.lora.rank:
            _check_megatron_rank_fits(critic, key)
        return
    if critic.lora.rank:
        raise ValueError(
            f"{key}.lora.rank={critic.lora.rank} is verl's megatron form of LoRA, and the critic trains with "
            f"strategy={config.critic_strategy}; set {key}.lora_rank (and lora_alpha, target_modules) instead."
        )
    if not critic.lora_rank:
        return
    from verl.models.lora_targets import check_lora_targets

    check_lora_targets(critic, key=key)


def _check_megatron_rank_fits(model: Any, key: str = KEY) -> None:
    """``lora.rank`` no wider than the narrowest targeted layer of the model (its Hugging Face config, read here);
    ``key`` is the model section's, for the message."""
    from verl.models.loading import load_hf_config
    from verl.models.mcore.config import build_transformer_config
    from verl.models.mcore.lora import layer_sizes

    hf = load_hf_config(model.path, model.trust_remote_code, model.override_config)
    sizes = layer_sizes(build_transformer_config(hf))
    kind, widest = min(((kind, min(sizes[kind])) for kind in model.lora.target_modules), key=lambda item: item[1])
    if model.lora.rank > widest:
        raise ValueError(
            f"{key}.lora.rank={model.lora.rank} is wider than {kind} takes ({widest}: the smaller of its input and "
            "output features); lower the rank."
        )
