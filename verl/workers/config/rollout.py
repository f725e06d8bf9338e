"""``actor_rollout_ref.rollout``: which engine generates, and how it samples (training and validation).

The sampling options have one set of rules, :func:`check_sampling_options`, applied wherever they are set: the
rollout section, validation's ``val_kwargs``, and :class:`SamplingParams`, the options a rollout samples one call
with (the section's values with a prompt batch's ``meta_info`` overrides applied). None of them has a default: the
YAML holds every one. :func:`register_rollout`, :func:`get_rollout_cls` and :func:`list_rollouts` work on
:data:`~verl.workers.config.registries.ROLLOUT_REGISTRY`, which this section's check of ``name`` and the engines
share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from verl.workers.config.out_of_scope import OUT_OF_SCOPE_ROLLOUTS
from verl.workers.config.profiler import ProfilerConfig
from verl.workers.config.registries import ROLLOUT_REGISTRY
from verl.workers.config.roles import MicroBatching
from verl.workers.config.schema import (
    BaseConfig,
    FieldError,
    build_config,
    check_int,
    check_int_list,
    check_number,
    check_one_of,
    refuse_unavailable,
)

ROLLOUT_KEY = "actor_rollout_ref.rollout"


def register_rollout(name: str):
    """Class decorator that registers a :class:`~verl.workers.rollout.BaseRollout` subclass under ``name``.

    Registering the same class twice is a no-op; a different class under a taken name raises ``ValueError``.
    """
    return ROLLOUT_REGISTRY.register(name)


def get_rollout_cls(name: str) -> type:
    """The rollout class registered under ``name``.

    Raises:
        ValueError: the name is not registered; the message lists the registered names.
    """
    return ROLLOUT_REGISTRY.get(name)


def list_rollouts() -> list[str]:
    """The registered rollout names (built-in and user-registered), sorted."""
    return ROLLOUT_REGISTRY.names()


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
        ignore_eos: generate ``response_length`` tokens whatever they are (an eos token does not end a response);
            fixed when the rollout is built, not overridable per call.
    """

    KEY: ClassVar[str] = ROLLOUT_KEY

    response_length: int
    n: int
    temperature: float
    top_k: int
    top_p: float
    do_sample: bool
    seed: int | None
    ignore_eos: bool

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
    """How validation prompts are answered (greedy by default): the trainer sends these as the per-call overrides
    of every validation batch (see :data:`OVERRIDABLE_KEYS`)."""

    n: int
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float

    def check(self) -> None:
        check_sampling_options(self)

    def as_overrides(self) -> dict[str, Any]:
        """The ``meta_info`` of a validation batch: every option of this section, under its rollout name."""
        return {name: getattr(self, name) for name in OVERRIDABLE_KEYS}


# The keys only the vLLM engine reads (refused, when changed, with another rollout).
VLLM_ROLLOUT_KEYS = (
    "dtype",
    "gpu_memory_utilization",
    "enforce_eager",
    "cudagraph_capture_sizes",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "max_num_batched_tokens",
    "max_num_seqs",
    "max_model_len",
    "disable_log_stats",
    "free_cache_engine",
    "enable_sleep_mode",
    "skip_tokenizer_init",
    "load_format",
    "layered_summon",
    "multi_stage_wake_up",
    "engine_kwargs",
    "checkpoint_engine",
)

# what stays out of the multi-turn rollouts (verl.experimental.agent_loop), refused by name
INTERACTIONS_WHY = (
    "verl's interactions (a simulated user answering between turns, multi_turn.interaction_config_path) are out of "
    "scope here; the agent loops run tools (multi_turn.tool_config_path / function_tool_path) and agent loops of "
    "your own (rollout.agent.agent_loop_config_path)"
)


@dataclasses.dataclass(frozen=True)
class EngineKwargsConfig(BaseConfig):
    """Extra keyword arguments of an engine, passed as given (``engine_kwargs.vllm`` for ``vllm.LLM``); verl's
    ``sglang`` and ``trtllm`` mappings exist so that their empty defaults are accepted, and are refused when set."""

    vllm: dict
    sglang: dict
    trtllm: dict

    def check(self) -> None:
        for name in ("sglang", "trtllm"):
            # verl's own default of sglang names attention_backend: null, so null entries count as unset
            if any(value is not None for value in getattr(self, name).values()):
                raise FieldError(name, f"is set, but {OUT_OF_SCOPE_ROLLOUTS[name]}. Remove it (leave it {{}}).")


@dataclasses.dataclass(frozen=True)
class MultiTurnConfig(BaseConfig):
    """verl's ``multi_turn`` section: with ``enable: true`` the rollout runs verl's agent loops
    (:mod:`verl.experimental.agent_loop`), multi-turn and tool-calling, on the rollout engines; with ``enable:
    false`` its other keys are read by nothing, as in verl. ``format`` names a registered tool parser (checked,
    when enabled, without importing the parsers until the check). Interactions are refused by name."""

    enable: bool
    max_assistant_turns: int | None
    tool_config_path: str | None
    # verl's file of @function_tool functions, beside the BaseTool YAML
    function_tool_path: str | None
    max_user_turns: int | None
    max_parallel_calls: int
    max_tool_response_length: int
    tool_response_truncate_side: Literal["left", "middle", "right"]
    interaction_config_path: str | None
    use_inference_chat_template: bool
    tokenization_sanity_check_mode: str
    format: str
    num_repeat_rollouts: int | None

    def check(self) -> None:
        if self.interaction_config_path is not None:
            raise FieldError("interaction_config_path", f"is set, but {INTERACTIONS_WHY}. Leave it null.")
        check_int(self, "max_parallel_calls", 1)
        check_int(self, "max_tool_response_length", 1)
        for name in ("max_assistant_turns", "max_user_turns"):
            if getattr(self, name) is not None:
                check_int(self, name, 1)
        if self.enable:
            from verl.workers.config.registries import tool_parser_names

            check_one_of(self, "format", tool_parser_names(), "registered tool parsers")


@dataclasses.dataclass(frozen=True)
class AgentConfig(BaseConfig):
    """verl's ``agent`` section: the agent loops of multi-turn rollouts (``multi_turn.enable``).

    ``num_workers``: verl's agent-loop workers, between which a batch's rows are split; each runs its rows' loops
    at once, so every trajectory of the batch is in flight together, as in verl (here they are groups on the
    driver's event loop, not processes). ``default_agent_loop``: the loop of a row without an ``agent_name``.
    ``agent_loop_config_path``: a YAML list of ``{name, _target_}`` registering loops of your own."""

    num_workers: int
    default_agent_loop: str
    agent_loop_config_path: str | None

    def check(self) -> None:
        check_int(self, "num_workers", 1)
        if not self.default_agent_loop:
            raise FieldError("default_agent_loop", "is empty; name an agent loop (single_turn_agent, tool_agent, ...).")


@dataclasses.dataclass(frozen=True)
class CheckpointEngineConfig(BaseConfig):
    """verl's ``checkpoint_engine``: how the trainer's weights reach the vLLM engine. ``naive`` (in-process copy) is
    the one backend; the weights go in buckets of ``update_weights_bucket_megabytes`` MiB
    (:mod:`verl.utils.weight_buckets`), a tensor bigger than that alone."""

    backend: Literal["naive"]
    update_weights_bucket_megabytes: int
    engine_kwargs: dict

    def check(self) -> None:
        check_int(self, "update_weights_bucket_megabytes", 1)
        if self.engine_kwargs:
            raise FieldError(
                "engine_kwargs", "is set, but the naive checkpoint engine takes no arguments; leave it {}."
            )


@dataclasses.dataclass(frozen=True)
class RolloutConfig(BaseConfig):
    """The rollout engine and its sampling options (see ``ppo_trainer.yaml`` for each key)."""

    KEY: ClassVar[str] = ROLLOUT_KEY

    name: str
    mode: Literal["sync", "async"]
    # verl's agent-loop processes of the async mode: none are needed here (AgentConfig)
    agent: AgentConfig
    n: int
    temperature: float
    top_p: float
    top_k: int
    do_sample: bool
    response_length: int
    prompt_length: int
    seed: int
    ignore_eos: bool
    calculate_log_probs: bool
    log_prob_micro_batch_size_per_gpu: int | None
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    dtype: Literal["float16", "bfloat16", "float32"] | None
    gpu_memory_utilization: float
    enforce_eager: bool
    cudagraph_capture_sizes: list[int] | None
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int | None
    disable_log_stats: bool
    free_cache_engine: bool
    # verl's switch of vLLM's sleep mode, which free_cache_engine's sleeping needs
    enable_sleep_mode: bool
    # vLLM's skip_tokenizer_init: the engine takes and returns token ids only
    skip_tokenizer_init: bool
    load_format: str
    layered_summon: bool
    multi_stage_wake_up: bool
    tensor_model_parallel_size: int
    data_parallel_size: int
    expert_parallel_size: int
    pipeline_model_parallel_size: int
    # verl's tensor-parallel size of a mixture-of-experts engine's experts (its TensorRT-LLM rollout): 1 only
    moe_tensor_parallel_size: int
    # verl's recording of a mixture-of-experts model's routing in the rollout (for router replay): false only
    enable_rollout_routing_replay: bool
    engine_kwargs: EngineKwargsConfig
    val_kwargs: ValKwargsConfig
    multi_turn: MultiTurnConfig
    checkpoint_engine: CheckpointEngineConfig
    # verl's profiler of the rollout: generation's traces on the ranks it names (verl.workers.config.profiler)
    profiler: ProfilerConfig

    def check(self) -> None:
        if self.name in OUT_OF_SCOPE_ROLLOUTS:
            raise FieldError("name", f"={self.name}: {OUT_OF_SCOPE_ROLLOUTS[self.name]}. Use name=vllm or naive.")
        check_one_of(self, "name", ROLLOUT_REGISTRY.names(), "registered rollouts")
        check_sampling_options(self)
        if self.ignore_eos and self.name == "hf":
            raise FieldError("ignore_eos", "=true is not supported by the hf rollout; use name=naive or vllm.")
        check_int(self, "prompt_length", 1)
        check_int(self, "log_prob_micro_batch_size_per_gpu", 1)
        check_int(self, "log_prob_max_token_len_per_gpu", 1)
        check_number(self, "gpu_memory_utilization", 0.0, 1.0, exclusive_min=True)
        check_int_list(self, "cudagraph_capture_sizes", 1)
        check_int(self, "max_num_batched_tokens", 1)
        check_int(self, "max_num_seqs", 1)
        check_int(self, "max_model_len", 1)
        check_int(self, "tensor_model_parallel_size", 1)
        refuse_unavailable(self, "enable_rollout_routing_replay", ROUTING_REPLAY_REASON)
        for name, why in PARALLEL_SIZES_OF_ONE.items():
            if getattr(self, name) != 1:
                raise FieldError(name, f"={getattr(self, name)}: {why}; set it to 1.")

    @property
    def sleeps(self) -> bool:
        """Whether the vLLM engine releases its weights and KV cache between generations (on a GPU): verl's
        ``free_cache_engine`` with vLLM's sleep mode on (``enable_sleep_mode``)."""
        return self.free_cache_engine and self.enable_sleep_mode

    def log_prob_micro_batching(self) -> MicroBatching:
        """How the actor's old-log-prob pass splits a batch (verl keeps these keys under ``rollout``)."""
        return MicroBatching(
            self.log_prob_micro_batch_size_per_gpu, self.log_prob_use_dynamic_bsz, self.log_prob_max_token_len_per_gpu
        )

    def sampling_options(self, seed_offset: int = 0) -> SamplingParams:
        """The options a rollout samples with (``seed`` shifted by ``seed_offset``: engines sample differently)."""
        options = {field.name: getattr(self, field.name) for field in dataclasses.fields(SamplingParams)}
        return SamplingParams(**{**options, "seed": self.seed + seed_offset})


ROUTING_REPLAY_REASON = (
    "router replay records a mixture-of-experts model's routing in the rollout and replays it in training; the "
    "backends here build dense models (no experts to route)"
)

# verl's rollout parallel sizes that stay 1 here, and why.
PARALLEL_SIZES_OF_ONE = {
    "data_parallel_size": (
        "the colocated engines are data parallel already (one per tensor-parallel group of the actor's ranks, "
        "trainer.nnodes x trainer.n_gpus_per_node / tensor_model_parallel_size of them), and vLLM's own data "
        "parallelism inside one engine (for mixture-of-experts servers) is not used"
    ),
    "expert_parallel_size": "expert parallelism of a mixture-of-experts engine is not supported by this rollout",
    "moe_tensor_parallel_size": (
        "verl reads it in its TensorRT-LLM rollout only (out of scope here), for mixture-of-experts engines, which "
        "this rollout does not split"
    ),
    "pipeline_model_parallel_size": (
        "the colocated vLLM engine runs tensor parallelism only (vLLM's in-process launcher has no pipeline stages)"
    ),
}


def check_rollout_layout(rollout: RolloutConfig, actor: Any, world_size: int, max_prompt_length: int) -> None:
    """The rules between the rollout and the actor it lives in (the hybrid engine), checked before Ray starts.

    ``tensor_model_parallel_size`` (TP) means: ``vllm``, the engine spans TP consecutive ranks of the actor group
    (TP must divide the rank count); ``naive``/``hf``, they sample from the training model, which is split the way
    the actor trains it, so TP must be 1 for ``dp``/``fsdp`` and equal the megatron actor's tensor-parallel size.

    Args:
        rollout: the rollout section.
        actor: the actor section (``strategy`` and ``megatron.tensor_model_parallel_size`` are read).
        world_size: the actor group's rank count (``trainer.nnodes x trainer.n_gpus_per_node``).
        max_prompt_length: ``data.max_prompt_length``, which ``prompt_length`` must hold.

    Raises:
        ValueError: a rule is broken; the message names the key and the fix.
    """
    key = f"{ROLLOUT_KEY}.tensor_model_parallel_size"
    tp = rollout.tensor_model_parallel_size
    if rollout.name == "vllm":
        if world_size % tp:
            raise ValueError(
                f"{key}={tp} does not divide the actor's {world_size} ranks (trainer.nnodes x "
                "trainer.n_gpus_per_node): each vLLM engine spans that many consecutive ranks; make the rank count a "
                "multiple of it."
            )
    else:
        actor_tp = actor.megatron.tensor_model_parallel_size if actor.strategy == "megatron" else 1
        if tp != actor_tp:
            where = (
                f"the megatron actor's actor_rollout_ref.actor.megatron.tensor_model_parallel_size={actor_tp}"
                if actor.strategy == "megatron"
                else f"1 with strategy={actor.strategy} (the model is not split by tensor parallelism)"
            )
            raise ValueError(
                f"{key}={tp} with {ROLLOUT_KEY}.name={rollout.name}: this rollout samples from the training model, "
                f"split as the actor trains it, so the size must be {where}. Set {key}={actor_tp}, or use "
                f"{ROLLOUT_KEY}.name=vllm for an engine of its own."
            )
    if rollout.prompt_length < max_prompt_length:
        raise ValueError(
            f"{ROLLOUT_KEY}.prompt_length={rollout.prompt_length} is shorter than data.max_prompt_length="
            f"{max_prompt_length}: the engine's context must hold the longest prompt; raise it (or leave it at its "
            "default, ${data.max_prompt_length})."
        )
