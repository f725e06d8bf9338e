"""The rollout registry, the rollout base class and the validated sampling options every rollout shares.

A rollout turns a batch of left-padded prompts into sampled responses laid out as the shared data contract says
(``prompts``, ``responses``, ``input_ids``, ``attention_mask``, ``position_ids``, ``response_mask``). Rollouts are
chosen by name through ``actor_rollout_ref.rollout.name`` and looked up in :data:`ROLLOUT_REGISTRY`. The sampling
options (``n``, ``temperature``, ``top_k``, ``top_p``, ``response_length``, ``do_sample``, ``seed``) are read from
the rollout config once, validated here so that every rollout rejects the same bad values with the same message,
and may be overridden per call through a prompt batch's ``meta_info`` (the trainer does so for greedy validation).
"""

from __future__ import annotations

import dataclasses
import numbers
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.protocol import DataProto
from verl.utils.registry import Registry

__all__ = [
    "ROLLOUT_REGISTRY",
    "BaseRollout",
    "SamplingParams",
    "get_rollout_cls",
    "list_rollouts",
    "register_rollout",
]

ROLLOUT_REGISTRY: Registry[type[BaseRollout]] = Registry("rollout", config_key="actor_rollout_ref.rollout.name")

_CONFIG_PREFIX = "actor_rollout_ref.rollout"

# The keys a prompt batch's meta_info may override for one call; the rest is fixed when the rollout is built.
OVERRIDABLE_KEYS = ("n", "temperature", "top_k", "top_p", "do_sample")


def register_rollout(name: str):
    """Class decorator that registers a :class:`BaseRollout` subclass under ``name``.

    Registering the same class twice is a no-op; a different class under a taken name raises ``ValueError``.
    """
    return ROLLOUT_REGISTRY.register(name)


def get_rollout_cls(name: str) -> type[BaseRollout]:
    """The rollout class registered under ``name``.

    Raises:
        ValueError: the name is not registered; the message lists the registered names.
    """
    return ROLLOUT_REGISTRY.get(name)


def list_rollouts() -> list[str]:
    """The registered rollout names, sorted."""
    return ROLLOUT_REGISTRY.names()


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Validated sampling options of a rollout.

    Attributes:
        response_length: number of generated tokens per response, R; responses are padded to exactly R.
        n: samples per prompt; prompts are repeated interleaved (``[a, a, b, b]``).
        temperature: logits are divided by it; 0 means greedy decoding.
        top_k: keep the k most likely tokens; ``<= 0`` turns the filter off.
        top_p: nucleus filter, keep the smallest set of tokens whose probability reaches top_p (at least one);
            1.0 turns it off.
        do_sample: False means greedy decoding whatever the temperature.
        seed: seeds the rollout's own ``torch.Generator``; None uses torch's global random state.
    """

    response_length: int
    n: int = 1
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    do_sample: bool = True
    seed: int | None = None

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        checks = [
            ("response_length", _is_int(self.response_length) and self.response_length >= 1, "an integer >= 1"),
            ("n", _is_int(self.n) and self.n >= 1, "an integer >= 1 (samples per prompt)"),
            (
                "temperature",
                _is_number(self.temperature) and self.temperature >= 0,
                "a number >= 0 (0 means greedy decoding)",
            ),
            ("top_k", _is_int(self.top_k), "an integer (<= 0 turns top-k filtering off)"),
            (
                "top_p",
                _is_number(self.top_p) and 0.0 <= self.top_p <= 1.0,
                "a number in [0, 1] (1.0 turns nucleus filtering off)",
            ),
            ("do_sample", isinstance(self.do_sample, bool), "true or false"),
            ("seed", self.seed is None or _is_int(self.seed), "an integer or null"),
        ]
        for key, ok, accepted in checks:
            if not ok:
                raise ValueError(
                    f"Invalid rollout option `{_CONFIG_PREFIX}.{key}`: got {getattr(self, key)!r}; it must be "
                    f"{accepted}. Fix the value in the config (or the command line override)."
                )

    @property
    def greedy(self) -> bool:
        """True when decoding picks the argmax token (``do_sample`` false or temperature 0)."""
        return not self.do_sample or self.temperature == 0

    @classmethod
    def from_config(cls, config: DictConfig | Mapping[str, Any]) -> SamplingParams:
        """Read the sampling options from a rollout config; keys this class does not use are ignored.

        Raises:
            ValueError: ``response_length`` is missing, or a value is invalid (the message names the key).
        """
        if isinstance(config, DictConfig):
            config = OmegaConf.to_container(config, resolve=True)
        if not isinstance(config, Mapping):
            raise ValueError(f"The rollout config must be a mapping, got {type(config).__name__}.")
        if config.get("response_length") is None:
            raise ValueError(
                f"Missing rollout option `{_CONFIG_PREFIX}.response_length`: set it to the number of tokens to "
                "generate per response (an integer >= 1), usually `${data.max_response_length}`."
            )
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in config.items() if key in fields})

    def with_overrides(self, meta_info: Mapping[str, Any] | None) -> SamplingParams:
        """A copy with the :data:`OVERRIDABLE_KEYS` found in ``meta_info`` applied (validated the same way)."""
        overrides = {key: meta_info[key] for key in OVERRIDABLE_KEYS if meta_info and key in meta_info}
        return dataclasses.replace(self, **overrides) if overrides else self


class BaseRollout(ABC):
    """A generator of responses for a batch of prompts.

    Subclasses implement :meth:`generate_sequences`, which takes a DataProto with left-padded ``input_ids``,
    ``attention_mask`` and ``position_ids`` (each (B, P)) and returns the shared rollout layout for ``B * n``
    rows, with the non-tensor fields repeated the same way and ``meta_info`` kept.
    """

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate responses for ``prompts``.

        Args:
            prompts: ``input_ids``, ``attention_mask``, ``position_ids``, each (B, P), left-padded.

        Returns:
            DataProto of ``B * n`` rows: ``prompts`` (B*n, P), ``responses`` (B*n, R), ``input_ids``,
            ``attention_mask``, ``position_ids`` (B*n, P+R), ``response_mask`` (B*n, R).
        """
