"""``actor_rollout_ref.rollout``: which engine generates, and how it samples (training and validation).

The sampling options have one set of rules, :func:`check_sampling_options`, applied wherever they are set: the
rollout section, validation's ``val_kwargs``, and :class:`SamplingParams`, the options a rollout samples one call
with (the section's values with a prompt batch's ``meta_info`` overrides applied). None of them has a default: the
YAML holds every one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from verl.workers.config.roles import MicroBatching
from verl.workers.config.schema import BaseConfig, FieldError, build_config, check_int, check_number, check_one_of

ROLLOUT_KEY = "actor_rollout_ref.rollout"

# The keys a prompt batch's meta_info may override for one call; the rest is fixed when the rollout is built.
OVERRIDABLE_KEYS = ("n", "temperature", "top_k", "top_p", "do_sample")


def check_sampling_options(obj: Any) -> None:
    """The rules of the sampling options, for whichever of them ``obj`` has (raises :class:`FieldError`).

    ``temperature`` 0 means greedy decoding (the log-probs of greedy tokens are taken at temperature 1, see
    :func:`~verl.utils.torch_functional.log_prob_temperature`); ``top_p`` is in (0, 1] (1 turns the nucleus filter
    off; 0 would keep no token); ``top_k`` <= 0 turns the top-k filter off.
    """
    rules = {
        "n": lambda: check_int(obj, "n", 1),
        "temperature": lambda: check_number(obj, "temperature", 0.0),
        "top_p": lambda: check_number(obj, "top_p", 0.0, 1.0, exclusive_min=True),
        "top_k": lambda: check_int(obj, "top_k"),
        "response_length": lambda: check_int(obj, "response_length", 1),
        "seed": lambda: check_int(obj, "seed", 0),
    }
    for name, rule in rules.items():
        if hasattr(obj, name):
            rule()


@dataclasses.dataclass(frozen=True)
class SamplingParams(BaseConfig):
    """The options one rollout call samples with, validated by the rules every rollout shares.

    Attributes:
        response_length: number of generated tokens per response, R; responses are padded to exactly R.
        n: samples per prompt; prompts are repeated interleaved (``[a, a, b, b]``).
        temperature: logits are divided by it; 0 means greedy decoding.
        top_k: keep the k most likely tokens; ``<= 0`` turns the filter off.
        top_p: nucleus filter in (0, 1], keep the smallest set of tokens whose probability reaches top_p (at least
            one); 1.0 turns it off.
        do_sample: False means greedy decoding whatever the temperature.
        seed: seeds the rollout's own random source; None uses torch's global random state.
    """

    KEY: ClassVar[str] = ROLLOUT_KEY

    response_length: int
    n: int
    temperature: float
    top_k: int
    top_p: float
    do_sample: bool
    seed: int | None

    def check(self) -> None:
        check_sampling_options(self)

    @property
    def greedy(self) -> bool:
        """True when decoding picks the argmax token (``do_sample`` false or temperature 0)."""
        return not self.do_sample or self.temperature == 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | SamplingParams) -> SamplingParams:
        """The sampling options of a rollout config (an OmegaConf node or a mapping); other keys are ignored.

        Every option must be present: :meth:`RolloutConfig.sampling_options` gives them from the YAML.

        Raises:
            ValueError: an option is missing or invalid (the message names its full key).
        """
        if isinstance(config, SamplingParams):
            return config
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):
            config = OmegaConf.to_container(config, resolve=True)
        if not isinstance(config, Mapping):
            raise ValueError(f"The rollout config must be a mapping, got {type(config).__name__}.")
        names = {field.name for field in dataclasses.fields(cls)}
        # build_config names a missing option (the YAML holds every default: RolloutConfig.sampling_options())
        return build_config(cls, {name: value for name, value in config.items() if name in names})

    def with_overrides(self, meta_info: Mapping[str, Any] | None) -> SamplingParams:
        """A copy with the :data:`OVERRIDABLE_KEYS` found in ``meta_info`` applied (validated the same way)."""
        overrides = {key: meta_info[key] for key in OVERRIDABLE_KEYS if meta_info and key in meta_info}
        if not overrides:
            return self
        try:
            return self.replace(**overrides)
        except FieldError as err:
            raise ValueError(
                f"The prompt batch's meta_info overrides {ROLLOUT_KEY}.{err.field} for this call, and "
                f"{err.field} {err.detail} Fix the value the caller puts in meta_info."
            ) from None


@dataclasses.dataclass(frozen=True)
class ValKwargsConfig(BaseConfig):
    """How validation prompts are answered (greedy by default)."""

    n: int
    do_sample: bool
    temperature: float

    def check(self) -> None:
        check_sampling_options(self)


# The keys only the vLLM engine reads (refused, when changed, with another rollout).
VLLM_ROLLOUT_KEYS = (
    "gpu_memory_utilization",
    "enforce_eager",
    "enable_chunked_prefill",
    "max_num_batched_tokens",
    "max_num_seqs",
    "free_cache_engine",
    "tensor_model_parallel_size",
    "engine_kwargs",
)


@dataclasses.dataclass(frozen=True)
class EngineKwargsConfig(BaseConfig):
    """Extra keyword arguments of an engine, passed as given (``engine_kwargs.vllm`` for ``vllm.LLM``)."""

    vllm: dict


@dataclasses.dataclass(frozen=True)
class RolloutConfig(BaseConfig):
    """The rollout engine and its sampling options (see ``ppo_trainer.yaml`` for each key)."""

    KEY: ClassVar[str] = ROLLOUT_KEY

    name: str
    n: int
    temperature: float
    top_p: float
    top_k: int
    do_sample: bool
    response_length: int
    seed: int
    log_prob_micro_batch_size_per_gpu: int
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    gpu_memory_utilization: float
    enforce_eager: bool
    enable_chunked_prefill: bool
    max_num_batched_tokens: int
    max_num_seqs: int
    free_cache_engine: bool
    tensor_model_parallel_size: int
    engine_kwargs: EngineKwargsConfig
    val_kwargs: ValKwargsConfig

    def check(self) -> None:
        from verl.workers.rollout import ROLLOUT_REGISTRY

        check_one_of(self, "name", ROLLOUT_REGISTRY.names(), "registered rollouts")
        check_sampling_options(self)
        check_int(self, "log_prob_micro_batch_size_per_gpu", 1)
        check_int(self, "log_prob_max_token_len_per_gpu", 1)
        check_number(self, "gpu_memory_utilization", 0.0, 1.0, exclusive_min=True)
        check_int(self, "max_num_batched_tokens", 1)
        check_int(self, "max_num_seqs", 1)
        check_int(self, "tensor_model_parallel_size", 1)

    def log_prob_micro_batching(self) -> MicroBatching:
        """How the actor's old-log-prob pass splits a batch (verl keeps these keys under ``rollout``)."""
        return MicroBatching(
            self.log_prob_micro_batch_size_per_gpu, self.log_prob_use_dynamic_bsz, self.log_prob_max_token_len_per_gpu
        )

    def sampling_options(self, seed_offset: int = 0) -> SamplingParams:
        """The options a rollout samples with (``seed`` shifted by ``seed_offset``: ranks sample differently)."""
        options = {field.name: getattr(self, field.name) for field in dataclasses.fields(SamplingParams)}
        return SamplingParams(**{**options, "seed": self.seed + seed_offset})
