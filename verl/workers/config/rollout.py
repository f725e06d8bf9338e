"""``actor_rollout_ref.rollout``: which engine generates, and how it samples (training and validation)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from verl.workers.config.roles import MicroBatching
from verl.workers.config.schema import BaseConfig, check_int, check_number, check_one_of


@dataclasses.dataclass(frozen=True)
class ValKwargsConfig(BaseConfig):
    """How validation prompts are answered (greedy by default)."""

    n: int
    do_sample: bool
    temperature: float

    def check(self) -> None:
        check_int(self, "n", 1)
        check_number(self, "temperature", 0.0)


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

    KEY: ClassVar[str] = "actor_rollout_ref.rollout"

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
        check_int(self, "n", 1)
        check_number(self, "temperature", 0.0)
        check_number(self, "top_p", 0.0, 1.0, exclusive_min=True)
        check_int(self, "response_length", 1)
        check_int(self, "seed", 0)
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

    def sampling_options(self, seed_offset: int = 0) -> dict:
        """The options a rollout samples with (``seed`` shifted by ``seed_offset``: ranks sample differently)."""
        return {
            "n": self.n,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "do_sample": self.do_sample,
            "response_length": self.response_length,
            "seed": self.seed + seed_offset,
        }
