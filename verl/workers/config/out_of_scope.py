"""verl's features that are out of scope here, refused by name at start-up with the reason, never as unknown keys.

verl's current release (1dda039) has sections and engines this project does not build: TransferQueue
(``transfer_queue.*``), the distillation trainers (``distillation.*``), the VeOmni, TorchTitan and AutoModel training
engines (``model_engine``, ``actor.veomni.*``, the ``*_actor`` components), Megatron Lite (``mlite_actor``, its
``actor.engine.*`` section), FSDP Turbo (``fsdp_config.turbo_config.*``, ``fsdp_config.strategy=fsdp_turbo``) and
Ascend NPUs. Each is named here once, with what to do instead; the sections whose off switch verl's scripts set
(``transfer_queue.enable``, ``distillation.enabled``) are typed here with that switch alone, so the off value starts
and on is refused. :func:`out_of_scope_message` is what a refused key says (the command line's explanation of a key
Hydra refused uses it, so does a section that gets a key of such a feature); ``docs/start/from_verl.md`` lists them.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from verl.workers.config.schema import BaseConfig, FieldError

_ENGINES = "this project's training backends are dp, fsdp/fsdp2 (model_engine=dp) and megatron-core (megatron)"

# Each out-of-scope feature: (its name, why it is out of scope here / what to use instead).
FEATURES: dict[str, tuple[str, str]] = {
    "transfer_queue": (
        "TransferQueue",
        "verl's distributed data plane between trainer and rollout (storage units, Mooncake) is not built here; "
        "the driver hands each batch to the workers itself",
    ),
    "distillation": (
        "the distillation trainers",
        "on-policy distillation from teacher models is not built here; train with the PPO/GRPO losses",
    ),
    "veomni": ("the VeOmni training engine", _ENGINES),
    "torchtitan": ("the TorchTitan training engine", _ENGINES),
    "automodel": ("the NeMo AutoModel training engine", _ENGINES),
    "mlite": (
        "Megatron Lite (verl's mlite_actor and its actor.engine section, from an external Megatron-LM branch)",
        "model_engine=megatron trains on megatron-core here, sized by actor.megatron.*",
    ),
    "fsdp_turbo": (
        "FSDP Turbo (the external fsdp_turbo package: fsdp_config.turbo_config, fsdp_config.strategy=fsdp_turbo)",
        "FSDP2 (actor.strategy=fsdp or fsdp2) with its fsdp_config keys is the FSDP backend here",
    ),
    "npu": ("Ascend NPUs", "this project trains on CUDA GPUs or on CPU processes"),
}

# verl's rollout engines that are out of scope here, and why (``rollout.name``, and their ``engine_kwargs`` section).
OUT_OF_SCOPE_ROLLOUTS = {
    "sglang": "SGLang rollouts are out of scope here (this project runs vLLM, and its own naive and hf samplers)",
    "trtllm": "TensorRT-LLM rollouts are out of scope here (this project runs vLLM, and its own naive and hf samplers)",
}
_ROLLOUT_NAME_KEYS = ("actor_rollout_ref.rollout.name", "rollout.name")

# Keys (fnmatch patterns; the key itself and every key under it) that ask for an out-of-scope feature.
KEY_FEATURES: dict[str, str] = {
    "transfer_queue": "transfer_queue",
    "distillation": "distillation",
    "actor_rollout_ref.*.veomni": "veomni",
    "critic.veomni": "veomni",
    "actor_rollout_ref.*.torchtitan": "torchtitan",
    "critic.torchtitan": "torchtitan",
    "actor_rollout_ref.*.automodel": "automodel",
    "critic.automodel": "automodel",
    "actor_rollout_ref.actor.engine": "mlite",
    "*.turbo_config": "fsdp_turbo",
}

# The off switches of the out-of-scope sections: keys of their own, accepted at false.
OFF_SWITCHES = ("transfer_queue.enable", "distillation.enabled")

# verl's model_engine values and component names (actor/ref/critic options) of the out-of-scope engines.
MODEL_ENGINES: dict[str, str] = {"veomni": "veomni", "torchtitan": "torchtitan", "automodel": "automodel"}
COMPONENT_PREFIXES: dict[str, str] = {
    "veomni_": "veomni",
    "torchtitan_": "torchtitan",
    "automodel_": "automodel",
    "mlite_": "mlite",
}


def feature_message(feature: str, what: str, fix: str) -> str:
    """``<what> asks for <feature>, which is out of scope here: <why>. <fix>``: the one wording of every refusal."""
    name, why = FEATURES[feature]
    return f"{what} asks for {name}, which is out of scope here: {why}. {fix}"


def out_of_scope_message(key: str) -> str | None:
    """What setting ``key`` (a full dotted key) says when it belongs to an out-of-scope feature; None otherwise (an
    off switch of :data:`OFF_SWITCHES` is a key of its own, refused only when on)."""
    if key in OFF_SWITCHES:
        return None
    for pattern, feature in KEY_FEATURES.items():
        if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in _prefixes(key)):
            return feature_message(feature, key, "Remove it from the command line (or the config file).")
    return None


def model_engine_message(value: Any) -> str | None:
    """What ``model_engine=<value>`` says when ``value`` names an out-of-scope engine; None otherwise."""
    feature = MODEL_ENGINES.get(str(value))
    if feature is None:
        return None
    return feature_message(feature, f"model_engine={value}", "Use model_engine=dp or model_engine=megatron.")


def component_message(group: str, option: str) -> str | None:
    """What a config-group override (``actor@actor_rollout_ref.actor=veomni_actor``) says when ``option`` is a
    component of an out-of-scope engine; None otherwise."""
    for prefix, feature in COMPONENT_PREFIXES.items():
        if option.startswith(prefix):
            folder = group.split("@")[0]
            fix = f"Use {group}=dp_{folder} or megatron_{folder}, or model_engine=dp or megatron."
            return feature_message(feature, f"{group}={option}", fix)
    return None


def override_message(override: str) -> str | None:
    """The refusal of a command-line override (``key=value``, ``+key=value``, ``group@pkg=option``) that asks for an
    out-of-scope feature; None for any other."""
    key, _, value = override.lstrip("+~").partition("=")
    if key == "model_engine":
        return model_engine_message(value)
    if key == "trainer.device" and value == "npu":
        return feature_message("npu", override, "Use auto, cuda or cpu.")
    if "@" in key or "/" in key:
        return component_message(key, value)
    return out_of_scope_message(key)


def _rollout_engine_message(key: str, value: str) -> str | None:
    """The refusal of ``rollout.name=sglang`` or of an entry of ``engine_kwargs.sglang`` (a null entry is verl's
    own default and is not one); None for any other override."""
    if key in _ROLLOUT_NAME_KEYS and value in OUT_OF_SCOPE_ROLLOUTS:
        return f"{key}={value}: {OUT_OF_SCOPE_ROLLOUTS[value]}. Use name=vllm or naive."
    parts = key.split(".")
    if "engine_kwargs" in parts[:-1]:
        engine = parts[parts.index("engine_kwargs") + 1]
        if engine in OUT_OF_SCOPE_ROLLOUTS and value.strip() not in ("", "null", "None", "{}"):
            return f"{key} is set, but {OUT_OF_SCOPE_ROLLOUTS[engine]}. Remove it (leave engine_kwargs.{engine} {{}})."
    return None


def command_line_refusals(overrides: Sequence[str]) -> list[str]:
    """Every override of a command line that asks for an out-of-scope feature, each with its refusal, in the
    command line's order. The command line checks these before anything else: a script that uses a feature this
    project leaves out hears that (all of them at once), not about the first unknown key Hydra meets."""
    refusals = []
    for override in overrides:
        message = override_message(override)
        key, _, value = override.lstrip("+~").partition("=")
        value = value.strip("'\"")
        if message is None and key in OFF_SWITCHES and value.lower() in ("true", "1"):
            feature = KEY_FEATURES[key.split(".")[0]]
            message = feature_message(feature, f"{key}={value}", "Set it to false (or remove it).")
        if message is None:
            message = _rollout_engine_message(key, value)
        if message is not None:
            refusals.append(message)
    return refusals


def _prefixes(key: str) -> list[str]:
    parts = key.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


class _OffSwitchSection(BaseConfig):
    """A section of an out-of-scope feature that holds only its off switch: verl's off value starts, on is refused,
    and any other key of the section is refused by the feature's name (it would configure the feature)."""

    SWITCH: ClassVar[str] = "enable"
    FEATURE: ClassVar[str] = ""

    @classmethod
    def from_shorthand(cls, value: Any, key: str) -> Any:
        if isinstance(value, Mapping):
            for name in value:
                if name != cls.SWITCH:
                    raise ValueError(feature_message(cls.FEATURE, f"{key}.{name}", "Remove it."))
        return value

    def check(self) -> None:
        if getattr(self, self.SWITCH):
            raise FieldError(self.SWITCH, feature_message(self.FEATURE, "=true", "Set it to false (or remove it)."))


@dataclasses.dataclass(frozen=True)
class TransferQueueConfig(_OffSwitchSection):
    """``transfer_queue``: verl's TransferQueue, ``enable: false`` only."""

    KEY: ClassVar[str] = "transfer_queue"
    SWITCH: ClassVar[str] = "enable"
    FEATURE: ClassVar[str] = "transfer_queue"

    enable: bool


@dataclasses.dataclass(frozen=True)
class DistillationConfig(_OffSwitchSection):
    """``distillation``: verl's distillation trainers, ``enabled: false`` only."""

    KEY: ClassVar[str] = "distillation"
    SWITCH: ClassVar[str] = "enabled"
    FEATURE: ClassVar[str] = "distillation"

    enabled: bool
