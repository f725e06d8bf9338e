"""verl's model config class name (``verl.workers.config.model.HFModelConfig``) over ``actor_rollout_ref.model``.

``HFModelConfig(path="Qwen/Qwen2.5-0.5B")`` is the model section of the YAML with that key changed
(:mod:`verl.workers.config.verl_named`). Unlike verl's, it does not load the Hugging Face config or tokenizer
when built; this package loads them where the model is built (:mod:`verl.models.loading`).

``OmegaConf.structured(HFModelConfig)`` works as in verl, with every key missing (``???``: the defaults live in the
YAML, not in the class), so that a command line's ``target_modules`` (a name or a list of names) merges over it.
OmegaConf refuses an annotation that is a union of containers, so this class annotates ``target_modules`` and
``exclude_modules`` as ``Any`` (verl's own annotation) and checks their type itself, with verl's ``TypeError``.
"""

from __future__ import annotations

from typing import Any

from verl.workers.config import roles
from verl.workers.config.verl_named import VerlNamedConfig, verl_named

__all__ = ["HFModelConfig"]

# the keys that take a module name or a list of names (None too, for exclude_modules)
_MODULE_NAME_KEYS = ("target_modules", "exclude_modules")


@verl_named()
class HFModelConfig(roles.ModelConfig, VerlNamedConfig):
    """``actor_rollout_ref.model`` under verl's name."""

    # read by OmegaConf (and by the section's own type check, which verl_check replaces for these two)
    target_modules: Any
    exclude_modules: Any

    @classmethod
    def verl_check(cls, values: dict[str, Any], extras: dict[str, Any]) -> None:
        for key in _MODULE_NAME_KEYS:
            value = values[key]
            if value is None and key == "exclude_modules":
                continue
            if not isinstance(value, str | list) or (
                isinstance(value, list) and not all(isinstance(name, str) for name in value)
            ):
                raise TypeError(
                    f"{cls.VERL_SECTION}.{key} must be a string or a list of strings (module names), got {value!r}."
                )
