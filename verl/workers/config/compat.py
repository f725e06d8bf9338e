"""Sections that exist so that verl's own scripts start here: verl's keys with verl's meaning, or refused by name.

verl's scripts set a custom dataset class, PF-PPO and the like. Each such section is typed here; its off value
(verl's default) is always accepted, and a value that asks for a feature this project does not have (a custom
dataset class, images) is refused at start-up with the feature's name and the reason, never as an unknown key.
``docs/start/from_verl.md`` lists them. verl's profiler sections are :mod:`verl.workers.config.profiler`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

from verl.workers.config.schema import BaseConfig, FieldError, check_int, check_number

ULYSSES_REASON = (
    "Ulysses sequence parallelism (one sequence split over several ranks) is not implemented here; every rank "
    "holds whole sequences"
)


@dataclasses.dataclass(frozen=True)
class CustomClsConfig(BaseConfig):
    """``data.custom_cls``: verl's own dataset class from a file. ``path: null`` (the built-in dataset) only."""

    path: str | None
    name: str | None

    def check(self) -> None:
        if self.path is not None:
            raise FieldError(
                "path",
                f"={self.path!r} asks for a custom dataset class: subclasses of verl's RLHFDataset (its "
                "processor/multimodal API) cannot run here, where rows are prompt, ground truth and data_source. "
                "Convert the data to parquet/JSONL in that layout and set data.custom_cls.path=null.",
            )


@dataclasses.dataclass(frozen=True)
class PFPPOConfig(BaseConfig):
    """``algorithm.pf_ppo``: how PF-PPO (``algorithm.use_pf_ppo``) weights each sample by its score.

    Attributes:
        reweight_method: pow (weight |score| ** weight_pow) | max_min (only the samples with the batch's highest
            or lowest score) | max_random (the highest-scored samples weigh 0.4, the others 0.1).
        weight_pow: the exponent of ``pow``.
    """

    reweight_method: Literal["pow", "max_min", "max_random"]
    weight_pow: float

    def check(self) -> None:
        check_number(self, "weight_pow", 0.0)


def check_ulysses(obj: Any, field: str = "ulysses_sequence_parallel_size") -> None:
    """``ulysses_sequence_parallel_size``: 1 (verl's default, no sequence parallelism) only."""
    check_int(obj, field, 1)
    if getattr(obj, field) != 1:
        raise FieldError(field, f"={getattr(obj, field)} asks for {ULYSSES_REASON}. Set it to 1.")


def check_ref_strategy(actor_strategy: str, ref_strategy: str) -> None:
    """``actor_rollout_ref.ref.strategy``: the reference runs in the actor's worker, on the actor's backend, so
    its strategy must be the actor's (fsdp and fsdp2 are one backend)."""
    same = {"fsdp": "fsdp2"}
    if same.get(ref_strategy, ref_strategy) != same.get(actor_strategy, actor_strategy):
        raise ValueError(
            f"actor_rollout_ref.ref.strategy={ref_strategy} differs from actor_rollout_ref.actor.strategy="
            f"{actor_strategy}: the reference model lives in the actor's worker and runs on its backend. Leave "
            "ref.strategy at its default (the actor's) or set the same value."
        )


# Config keys whose value is an open mapping handed on to another library (megatron-core's dataclasses, vllm.LLM, a
# Hugging Face config, a chat template): verl's scripts add entries with "+key=value", and a plain "key=value" for
# an entry the YAML does not list is turned into Hydra's "++key=value" (add or replace) by open_mapping_override, so
# that both spellings work. The entries are checked where they are read (megatron.check_passthrough_keys, the
# vLLM engine's argument check, the model path check).
OPEN_MAPPINGS = (
    ("override_transformer_config",),
    ("override_ddp_config",),
    ("override_optimizer_config",),
    ("override_config",),
    ("engine_kwargs", "vllm"),
    ("apply_chat_template_kwargs",),
)


def open_mapping_override(override: str) -> str:
    """A command-line override, with ``++`` put before a plain ``key=value`` whose key lies inside one of
    :data:`OPEN_MAPPINGS` (``actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len=4096``): Hydra adds such an
    entry only when asked to, and the YAML's mapping cannot list every key of the library it feeds. Any other
    override (a prefixed one, a group choice, a key outside those mappings) is returned as it is."""
    if override[:1] in "+~" or "=" not in override:
        return override
    key = override.split("=", 1)[0]
    if "@" in key or "/" in key:
        return override
    parts = key.split(".")
    for mapping in OPEN_MAPPINGS:
        width = len(mapping)
        # an entry inside the mapping: the mapping's name, then at least one key below it
        if any(tuple(parts[i : i + width]) == mapping for i in range(len(parts) - width)):
            return "++" + override
    return override


def command_line_override(override: str, config_name: str = "ppo_trainer") -> str:
    """A command-line override as Hydra is to read it: verl's scripts' spellings that Hydra would refuse here.

    - ``+key=value`` on a dotted key that verl's YAML does not define (in its config ``config_name``:
      :func:`~verl.workers.config.verl_keys.defined_in_verl`) becomes ``++key=value`` (add or set). verl's scripts
      add with ``+`` the keys verl's YAML leaves out (``+actor_rollout_ref.rollout.moe_tensor_parallel_size=2``);
      where this package's YAML holds such a key with its documented default, Hydra's ``+`` would refuse it ("An
      item is already at ..."), while for a key the YAML lacks ``+`` and ``++`` do the same. ``+`` on a key verl's
      YAML defines stays as it is: Hydra refuses it here as verl's does (:func:`append_refusal`). An unknown key
      is still refused, by the typed schema. A group choice (``+group=option``, ``+group@package=option``,
      ``a/b``) and Hydra's own section (``+hydra.*``) keep Hydra's meaning.
    - a plain entry of an open mapping (:data:`OPEN_MAPPINGS`): see :func:`open_mapping_override`.
    """
    from verl.workers.config.verl_keys import defined_in_verl

    key = override.split("=", 1)[0]
    if key.startswith("+") and not key.startswith("++") and "=" in override:
        name = key[1:]
        config_key = "." in name and not any(mark in name for mark in ("@", "/")) and not name.startswith("hydra.")
        return "+" + override if config_key and not defined_in_verl(name, config_name) else override
    return open_mapping_override(override)


_APPEND_REFUSAL = re.compile(r"Could not append to config\. An item is already at '([^']+)'")


def append_refusal(hydra_message: str) -> str | None:
    """Our message for Hydra's refusal of ``+key=value`` on a key the config has, which after
    :func:`command_line_override` means a key verl's YAML defines too; None for any other message."""
    match = _APPEND_REFUSAL.search(hydra_message)
    if match is None:
        return None
    key = match.group(1)
    return (
        f"+{key}=...: {key} is a key of the config already (verl's YAML defines it too, so verl's Hydra refuses "
        f"this '+' as well: '+' only adds keys a config lacks). Set it without '+': {key}=<value>."
    )
