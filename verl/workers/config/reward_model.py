"""The ``reward_model`` section: the reward manager (rule-based scores) and an optional model-based reward.

:class:`RewardModelConfig` holds both halves of verl's section. The reward manager and its scoring function turn
each response into ``token_level_scores``; with ``enable`` a Hugging Face sequence-classification model (one
label) runs in a worker group of its own and scores every response instead, as verl's reward-model worker does
(see :mod:`verl.workers.reward_model`). The model's keys (``model.*``, ``strategy``, micro-batch sizes,
``max_length``, the token budget) are checked here only when ``enable`` is true, so a run without a reward model
never has to name one. verl switches for features this project lacks are accepted while off and refused when on.

verl's reward loop (``use_reward_loop: true``, ``num_workers``, ``reward_model.rollout.*``) computes the same
scores with the reward model served by an inference engine; here ``use_reward_loop`` keeps the worker group and
takes from the engine's keys what decides the scores: the context length (``input_max_length``) and batching by
tokens (``scores_by_token_budget``). ``num_workers`` (verl's reward-manager processes) has no counterpart: the
reward manager runs in the trainer.

verl's current release spells these settings in a top-level ``reward`` section (``reward.reward_manager.name``,
``reward.reward_model.model_path``, ...). That section is folded into this one before the config is built
(:mod:`verl.workers.config.reward`), so this class is the one description of the reward the trainer reads.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from verl.workers.config.algorithm import OverlongBufferConfig
from verl.workers.config.roles import DType, MicroBatching, WrapPolicyConfig
from verl.workers.config.schema import (
    BaseConfig,
    FieldError,
    check_int,
    check_number,
    check_one_of,
    refuse_unavailable,
)

RewardModelStrategy = Literal["dp", "fsdp", "fsdp2", "megatron"]


@dataclasses.dataclass(frozen=True)
class RewardModelFSDPConfig(BaseConfig):
    """``reward_model.model.fsdp_config``: how the frozen reward model is sharded (strategy ``fsdp``/``fsdp2``)."""

    param_offload: bool
    reshard_after_forward: bool
    fsdp_size: int
    forward_prefetch: bool
    wrap_policy: WrapPolicyConfig

    def check(self) -> None:
        if self.fsdp_size != -1:
            raise FieldError(
                "fsdp_size",
                f"={self.fsdp_size}: the reward model is sharded over all ranks of its group here (hybrid "
                "sharding over a part of them is not available); set it to -1.",
            )


@dataclasses.dataclass(frozen=True)
class RewardModelModelConfig(BaseConfig):
    """``reward_model.model``: the reward model's weights and how its inputs are tokenised."""

    path: str | None
    input_tokenizer: str | None
    trust_remote_code: bool
    use_remove_padding: bool
    fsdp_config: RewardModelFSDPConfig


@dataclasses.dataclass(frozen=True)
class SandboxFusionConfig(BaseConfig):
    """``reward_model.sandbox_fusion``: verl's remote code-execution scorer, not available here (url must be null)."""

    url: str | None
    max_concurrent: int
    memory_limit_mb: int

    def check(self) -> None:
        if self.url is not None:
            raise FieldError(
                "url",
                f"={self.url!r} asks for verl's sandbox-fusion code execution, which this project does not have; "
                "score code with a custom_reward_function (trusted code run in the trainer) and set url=null.",
            )


@dataclasses.dataclass(frozen=True)
class RewardLoopEngineConfig(BaseConfig):
    """``reward_model.rollout``: verl's inference engine that serves the reward model in its reward loop.

    Here the reward model always scores in a worker group of its own (a Hugging Face forward pass per micro-batch);
    no engine is started. The lengths bound what the model reads (``prompt_length + response_length`` tokens, the
    engine's context in verl); the engine's sizing (``gpu_memory_utilization``, ``tensor_model_parallel_size``,
    ``max_num_seqs``, ...) has nothing to size here and is only checked for range.
    """

    name: str | None
    dtype: str
    gpu_memory_utilization: float
    enforce_eager: bool
    free_cache_engine: bool
    data_parallel_size: int
    expert_parallel_size: int
    tensor_model_parallel_size: int
    max_num_batched_tokens: int
    max_model_len: int | None
    max_num_seqs: int
    load_format: str
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    prompt_length: int
    response_length: int

    def check(self) -> None:
        if self.name not in (None, "vllm"):
            raise FieldError(
                "name",
                f"={self.name!r}: the reward loop's engines other than vLLM (SGLang, TensorRT-LLM) are out of scope "
                "here; set name=vllm (served here by the reward model's worker group).",
            )
        check_number(self, "gpu_memory_utilization", 0.0, 1.0, exclusive_min=True)
        for name in ("data_parallel_size", "expert_parallel_size", "tensor_model_parallel_size", "max_num_seqs"):
            check_int(self, name, 1)
        for name in ("max_num_batched_tokens", "max_model_len", "prompt_length", "response_length"):
            check_int(self, name, 1)

    @property
    def context_length(self) -> int:
        """Tokens of one sequence the engine reads: ``max_model_len``, else ``prompt_length + response_length``."""
        return self.max_model_len or self.prompt_length + self.response_length


@dataclasses.dataclass(frozen=True)
class RewardModelConfig(BaseConfig):
    """``reward_model``: the reward manager, an optional custom scoring function, and the model-based reward."""

    KEY: ClassVar[str] = "reward_model"

    enable: bool
    strategy: RewardModelStrategy
    dtype: DType
    model: RewardModelModelConfig
    micro_batch_size: int | None
    micro_batch_size_per_gpu: int | None
    max_length: int | None
    use_dynamic_bsz: bool
    forward_max_token_len_per_gpu: int
    use_reward_loop: bool
    num_workers: int
    rollout: RewardLoopEngineConfig
    launch_reward_fn_async: bool
    sandbox_fusion: SandboxFusionConfig
    reward_manager: str
    custom_score_fn: str | None
    overlong_buffer: OverlongBufferConfig
    reward_kwargs: Any

    def check(self) -> None:
        from verl.workers.config.registries import REWARD_MANAGER_REGISTRY

        check_one_of(self, "reward_manager", REWARD_MANAGER_REGISTRY.names(), "registered reward managers")
        self._check_reward_kwargs(REWARD_MANAGER_REGISTRY.get(self.reward_manager))
        if self.overlong_buffer.enable and self.reward_manager != "dapo":
            raise FieldError(
                "overlong_buffer.enable",
                f"=true, but the {self.reward_manager!r} reward manager does not read it: the overlong penalty is the "
                "dapo manager's; set reward_model.reward_manager=dapo.",
            )
        refuse_unavailable(self, "launch_reward_fn_async", "the reward is computed in the trainer, in step")
        check_int(self, "num_workers", 1)
        check_int(self, "micro_batch_size", 1)
        check_int(self, "micro_batch_size_per_gpu", 1)
        check_int(self, "max_length", 1)
        check_int(self, "forward_max_token_len_per_gpu", 1)
        if self.enable:
            self._check_model()

    def _check_reward_kwargs(self, manager_cls: Any) -> None:
        """verl's ``reward_kwargs``: keyword arguments of the reward manager, each a parameter it takes."""
        if not isinstance(self.reward_kwargs, Mapping):
            raise FieldError("reward_kwargs", f"must be a mapping of keyword arguments, got {self.reward_kwargs!r}.")
        parameters = inspect.signature(manager_cls).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return
        # the trainer passes these itself: the tokenizer, and the scorer of custom_score_fn / custom_reward_function
        accepted = sorted(set(parameters) - {"tokenizer", "compute_score"})
        for name in self.reward_kwargs:
            if name not in accepted:
                raise FieldError(
                    f"reward_kwargs.{name}",
                    f"is not a keyword argument of the {self.reward_manager!r} reward manager "
                    f"({manager_cls.__name__}); it takes {accepted}.",
                )
        if "overlong_buffer_cfg" in self.reward_kwargs and self.overlong_buffer.enable:
            raise FieldError(
                "reward_kwargs.overlong_buffer_cfg",
                "and reward_model.overlong_buffer.enable=true both set the overlong penalty: set one of them.",
            )

    def _check_model(self) -> None:
        if not self.model.path:
            raise FieldError("model.path", "is empty: set it to a Hugging Face sequence-classification model.")
        if self.strategy == "megatron":
            raise FieldError(
                "strategy",
                "=megatron: the reward model runs on Hugging Face models here; use fsdp (FSDP2, verl's default) or "
                "dp. The actor may still train with megatron.",
            )
        if self.micro_batch_size is not None and self.micro_batch_size_per_gpu is not None:
            raise FieldError(
                "micro_batch_size",
                "and reward_model.micro_batch_size_per_gpu are both set; set only one (micro_batch_size is the "
                "global count, split over the ranks).",
            )
        if not self.scores_by_token_budget and self.micro_batch_size is None and self.micro_batch_size_per_gpu is None:
            raise FieldError(
                "micro_batch_size_per_gpu",
                "is null (and so is micro_batch_size): the reward model scores in micro-batches; set "
                "reward_model.micro_batch_size_per_gpu (e.g. 8), or reward_model.use_dynamic_bsz=true with "
                "reward_model.forward_max_token_len_per_gpu.",
            )

    def micro_batching(self, num_ranks: int) -> MicroBatching:
        """The per-rank micro-batching of the scoring pass (verl: the global ``micro_batch_size`` over the ranks).

        Raises:
            ValueError: ``micro_batch_size`` is smaller than the number of ranks.
        """
        size = self.micro_batch_size_per_gpu
        if size is None and self.micro_batch_size is not None:
            size = self.micro_batch_size // num_ranks
            if size < 1:
                raise ValueError(
                    f"reward_model.micro_batch_size={self.micro_batch_size} is less than one sample for each of the "
                    f"{num_ranks} ranks; raise it or set reward_model.micro_batch_size_per_gpu."
                )
        # by token budget the size is unused: the budget decides
        return MicroBatching(size or 1, self.scores_by_token_budget, self.forward_max_token_len_per_gpu)

    @property
    def scores_by_token_budget(self) -> bool:
        """Micro-batches by ``forward_max_token_len_per_gpu`` real tokens: with ``use_dynamic_bsz``, and under verl's
        reward loop when no micro-batch size is set (verl's engine batches by tokens there, not by a count)."""
        no_size = self.micro_batch_size is None and self.micro_batch_size_per_gpu is None
        return self.use_dynamic_bsz or (self.use_reward_loop and no_size)

    @property
    def input_max_length(self) -> int | None:
        """Tokens of each sequence the reward model reads at most: ``max_length``; when it is null, under the reward
        loop, the engine's context (``rollout.prompt_length + rollout.response_length``); else all."""
        if self.max_length is not None or not self.use_reward_loop:
            return self.max_length
        return self.rollout.context_length
