"""The sections of the models a run trains or reads: model paths, actor, reference, critic.

Actor and critic share :class:`TrainedModelConfig` (precision, batch sizes, optimizer, update-failure policy, fire
drill, megatron layout, seed); each adds its own loss settings. :meth:`MegatronConfig.training_path` is the one
chooser of the megatron training path, for actor and critic alike.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from verl.utils.micro_batching import MicroBatching
from verl.workers.config.compat import ProfilerConfig, check_ulysses
from verl.workers.config.lora import MegatronLoraConfig, check_lora_fields
from verl.workers.config.megatron import MegatronConfig
from verl.workers.config.optim import OptimConfig
from verl.workers.config.precision import (  # noqa: F401  (FSDP_STRATEGIES: re-exported, its old home)
    FSDP_STRATEGIES,
    MixedPrecisionConfig,
    VerlDType,
)
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

logger = logging.getLogger(__name__)

Strategy = Literal["dp", "fsdp", "fsdp2", "megatron"]
DType = Literal["float16", "bfloat16", "float32"]
LossAggMode = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
# a "+" suffix: the named estimator's value with the k2 gradient (straight-through), as in verl
KLType = Literal[
    "kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "kl+", "k1+", "abs+", "mse+", "k2+", "low_var_kl+", "k3+"
]
STRATEGIES = typing.get_args(Strategy)
DTYPES = typing.get_args(DType)


@dataclasses.dataclass(frozen=True)
class FusedKernelOptionsConfig(BaseConfig):
    """``actor_rollout_ref.model.fused_kernel_options``: how ``use_fused_kernels`` computes (``verl.utils.kernel``).

    ``impl_backend``: ``torch`` or verl's ``triton``; both are served by the chunked PyTorch kernel, which computes
    the same log-probs and entropy on every device (verl's Triton kernel itself is not provided).
    """

    impl_backend: Literal["torch", "triton"]


def check_override_config(model: Any) -> None:
    """``override_config`` must be a mapping of config attribute names (checked against the model's config when
    the model path is checked, :func:`verl.trainer.main_ppo.check_model_path`)."""
    if not isinstance(model.override_config, Mapping):
        raise FieldError(
            "override_config",
            f"must be a mapping of Hugging Face config attributes to values (e.g. {{attention_dropout: 0.0}}), got "
            f"{model.override_config!r}.",
        )


@dataclasses.dataclass(frozen=True)
class ModelConfig(BaseConfig):
    """``actor_rollout_ref.model``: where the weights and the tokenizer come from."""

    KEY: ClassVar[str] = "actor_rollout_ref.model"

    path: str
    tokenizer_path: str | None
    enable_gradient_checkpointing: bool
    use_remove_padding: bool
    use_onednn_linear: bool
    use_fused_kernels: bool
    fused_kernel_options: FusedKernelOptionsConfig
    trust_remote_code: bool
    # verl's Hugging Face config overrides (attribute -> value), set on the model's config wherever it is loaded
    override_config: Any
    # the workers load the model (and tokenizer, LoRA adapter) from a copy in /dev/shm: verl.utils.fs.copy_to_shm
    use_shm: bool
    # LoRA through peft (docs/advance/lora.md); the rules that read other sections: verl.workers.config.lora
    lora_rank: int
    lora_alpha: float
    target_modules: str | list[str]
    exclude_modules: str | list[str] | None
    lora_adapter_path: str | None
    lora: MegatronLoraConfig

    def check(self) -> None:
        if not self.path:
            raise FieldError("path", "is empty: set it to a Hugging Face model directory, or 'default'.")
        check_override_config(self)
        check_lora_fields(self)

    @property
    def uses_lora(self) -> bool:
        """Whether the actor trains LoRA adapters instead of all its weights: ``lora_rank > 0``, or, as in verl,
        ``lora_adapter_path`` set (the adapter saved there brings its own rank and targets)."""
        return self.lora_rank > 0 or bool(self.lora_adapter_path)


@dataclasses.dataclass(frozen=True)
class WrapPolicyConfig(BaseConfig):
    """Which modules get their own FSDP2 unit (``fully_shard``); null: the model's decoder layers."""

    transformer_layer_cls_to_wrap: list[str] | None


@dataclasses.dataclass(frozen=True)
class FSDPConfig(BaseConfig):
    """FSDP2 settings of a trained model (strategy ``fsdp2`` / ``fsdp``).

    ``model_dtype`` and ``mixed_precision`` are verl's precision keys; how they relate to the role's ``dtype``, and
    which combinations are refused, is :mod:`verl.workers.config.precision` (checked by
    :func:`~verl.workers.config.precision.fsdp_precision`, at start-up and again where the model is sharded).
    """

    param_offload: bool
    optimizer_offload: bool
    reshard_after_forward: bool
    # verl's FSDP1 flat-parameter switch; FSDP2 has no flat parameters, so both values mean what true means
    use_orig_params: bool
    forward_prefetch: bool
    # dtype of the loaded weights and the shards (the master copy); null: fp32
    model_dtype: VerlDType | None
    mixed_precision: MixedPrecisionConfig
    wrap_policy: WrapPolicyConfig


@dataclasses.dataclass(frozen=True)
class RefFSDPConfig(BaseConfig):
    """FSDP2 settings of the frozen reference model (no optimizer, so nothing of it to offload); its precision keys
    as :class:`FSDPConfig`'s, with the actor's ``dtype`` as the compute dtype."""

    param_offload: bool
    reshard_after_forward: bool
    forward_prefetch: bool
    model_dtype: VerlDType | None
    mixed_precision: MixedPrecisionConfig


@dataclasses.dataclass(frozen=True)
class CriticModelConfig(BaseConfig):
    """``critic.model``: the model the value model starts from, and how it is held in memory."""

    path: str
    enable_gradient_checkpointing: bool
    use_remove_padding: bool
    use_onednn_linear: bool
    fsdp_config: FSDPConfig
    trust_remote_code: bool
    override_config: Any
    # LoRA: the dp/fsdp form (peft) and verl's megatron form; the rules that read other sections:
    # verl.workers.config.lora
    lora_rank: int
    lora_alpha: float
    target_modules: str | list[str]
    lora: MegatronLoraConfig

    def check(self) -> None:
        if not self.path:
            raise FieldError("path", "is empty: set it to a Hugging Face model directory, or 'default'.")
        check_override_config(self)
        check_int(self, "lora_rank", 0)
        check_number(self, "lora_alpha", 0, exclusive_min=True)


@dataclasses.dataclass(frozen=True)
class FaultInjectionConfig(BaseConfig):
    """The fire drill: update steps (1-based) whose gradients become NaN, on all ranks (null) or on some."""

    nonfinite_grad_steps: list[int]
    ranks: list[int] | None

    def check(self) -> None:
        check_int_list(self, "nonfinite_grad_steps", 1)
        check_int_list(self, "ranks", 0)


#: What a checkpoint of a trained model holds (verl's ``checkpoint.save_contents`` names): the weights, the optimizer
#: state, the rest of the training state (schedule, scaler, counters, RNG), and optionally a Hugging Face export.
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
_RESUME_CONTENTS = ("model", "optimizer", "extra")


@dataclasses.dataclass(frozen=True)
class CheckpointContentsConfig(BaseConfig):
    """``<role>.checkpoint``: what each checkpoint writes and what a resume reads.

    ``model``, ``optimizer`` and ``extra`` are always written and read, since a resume here is exact; ``hf_model``
    adds a ``huggingface/`` directory that ``transformers`` loads (a LoRA run: the merged weights). Lists without
    one of the three are refused rather than half honoured.
    """

    save_contents: list[str]
    load_contents: list[str]

    def check(self) -> None:
        for field in ("save_contents", "load_contents"):
            values = list(getattr(self, field))
            unknown = [item for item in values if item not in CHECKPOINT_CONTENTS]
            if unknown:
                raise FieldError(field, f"holds {unknown[0]!r}; each entry is one of {list(CHECKPOINT_CONTENTS)}.")
            missing = [item for item in _RESUME_CONTENTS if item not in values]
            if missing:
                raise FieldError(
                    field,
                    f"leaves out {missing}: every checkpoint here writes and reads {list(_RESUME_CONTENTS)} so that "
                    "a resume is exact (only 'hf_model' is optional). Add them back.",
                )

    @property
    def hf_model(self) -> bool:
        """Whether each checkpoint also writes the ``huggingface/`` export."""
        return "hf_model" in self.save_contents


@dataclasses.dataclass(frozen=True)
class TrainedModelConfig(BaseConfig):
    """What actor and critic share: precision, batch sizes, passes, optimizer, failure policy, fire drill, seed.

    ``ppo_mini_batch_size`` counts prompts in the YAML; the worker hands the update loop a copy counting samples
    per rank (:meth:`per_rank`).
    """

    ROLE: ClassVar[str] = "actor"

    dtype: DType
    ppo_mini_batch_size: int
    ppo_micro_batch_size_per_gpu: int | None
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int
    ppo_epochs: int
    shuffle: bool
    loss_agg_mode: LossAggMode
    update_failure_policy: Any
    fault_injection: FaultInjectionConfig
    optim: OptimConfig
    megatron: MegatronConfig
    seed: int
    ulysses_sequence_parallel_size: int
    profiler: ProfilerConfig
    checkpoint: CheckpointContentsConfig

    def check(self) -> None:
        check_ulysses(self)
        check_int(self, "ppo_mini_batch_size", 1)
        check_int(self, "ppo_micro_batch_size_per_gpu", 1)
        check_int(self, "ppo_max_token_len_per_gpu", 1)
        check_int(self, "ppo_epochs", 1)
        check_int(self, "seed", 0)
        self._check_policy()

    def _check_policy(self) -> None:
        from verl.workers.update_outcome import build_update_outcome_handler

        # Build the handler once here, so a typo or a bad parameter fails at start-up, not in a Ray worker.
        build_update_outcome_handler(self.update_failure_policy, dtype=self.dtype, role=self.ROLE)

    def train_micro_batching(self) -> MicroBatching:
        """How a mini-batch splits into micro-batches for gradient accumulation."""
        return MicroBatching(self.ppo_micro_batch_size_per_gpu, self.use_dynamic_bsz, self.ppo_max_token_len_per_gpu)

    def per_rank(self, rollout_n: int, world_size: int):
        """A copy whose ``ppo_mini_batch_size`` counts samples on one rank (prompts x ``rollout_n`` / ranks)."""
        samples = self.ppo_mini_batch_size * rollout_n
        if samples % world_size:
            raise ValueError(
                f"{self.KEY}.ppo_mini_batch_size x rollout.n = {samples} samples do not split over {world_size} "
                f"ranks; make it a multiple of trainer.n_gpus_per_node x trainer.nnodes."
            )
        return dataclasses.replace(self, ppo_mini_batch_size=samples // world_size)


@functools.lru_cache(maxsize=8)
def _trainer_yaml_section(key: str) -> dict[str, Any]:
    from omegaconf import OmegaConf

    path = Path(__file__).resolve().parents[2] / "trainer" / "config" / "ppo_trainer.yaml"
    return OmegaConf.to_container(OmegaConf.select(OmegaConf.load(path), key), resolve=True)


def trainer_yaml_section(key: str) -> dict[str, Any]:
    """A copy of the section ``key`` (dotted) of ``ppo_trainer.yaml``: the defaults a shorthand or a preset fills
    in, read from the one file that holds them."""
    return dict(_trainer_yaml_section(key))


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig(BaseConfig):
    """``actor_rollout_ref.actor.policy_loss``: the policy loss by name and the options of the losses that have any.

    A bare name (``policy_loss=gspo``, this project's older spelling) stands for ``{loss_mode: gspo}`` with every
    other key at its YAML default (:meth:`from_shorthand`).
    """

    KEY: ClassVar[str] = "actor_rollout_ref.actor.policy_loss"

    loss_mode: str
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float
    dro_beta: float | None

    @classmethod
    def from_shorthand(cls, value: Any, key: str) -> Any:
        if isinstance(value, str):
            return {**trainer_yaml_section(cls.KEY), "loss_mode": value}
        return value

    def check(self) -> None:
        from verl.algorithms.core_algos import POLICY_LOSS_REGISTRY

        check_one_of(self, "loss_mode", POLICY_LOSS_REGISTRY.names(), "registered policy losses")
        check_number(self, "clip_cov_ratio", 0.0, 1.0, exclusive_min=True)
        check_number(self, "kl_cov_ratio", 0.0, 1.0, exclusive_min=True)
        check_number(self, "ppo_kl_coef", 0.0)
        check_number(self, "dro_beta", 0.0, exclusive_min=True)
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise FieldError(
                "clip_cov_lb",
                f"={self.clip_cov_lb} must be below clip_cov_ub={self.clip_cov_ub} (the band of ratios clip_cov "
                "leaves alone); lower clip_cov_lb or raise clip_cov_ub.",
            )
        if self.loss_mode == "dro" and self.dro_beta is None:
            raise FieldError(
                "dro_beta",
                "is null, and loss_mode=dro needs it: set actor_rollout_ref.actor.policy_loss.dro_beta to a number "
                "> 0 (the weight of DRO's quadratic penalty on the log-ratio).",
            )


@dataclasses.dataclass(frozen=True)
class ActorConfig(TrainedModelConfig):
    """``actor_rollout_ref.actor``: the policy's training settings (see ``ppo_trainer.yaml`` for each key)."""

    KEY: ClassVar[str] = "actor_rollout_ref.actor"
    ROLE: ClassVar[str] = "actor"

    strategy: Strategy
    fsdp_config: FSDPConfig
    recompute_old_log_prob: Literal["auto", True]
    use_rollout_log_probs: bool
    freeze_vision_tower: bool
    policy_loss: PolicyLossConfig
    clip_ratio: float
    clip_ratio_low: float | None
    clip_ratio_high: float | None
    clip_ratio_c: float
    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: KLType
    tau_pos: float
    tau_neg: float
    loss_scale_factor: float | None
    use_torch_compile: bool
    use_fused_kernels: bool
    entropy_from_logits_with_chunking: bool
    entropy_checkpointing: bool

    def __post_init__(self) -> None:
        # a bare loss name or a mapping handed to the constructor (replace(policy_loss="gspo")) becomes the section
        if isinstance(self.policy_loss, str | Mapping):
            values = PolicyLossConfig.from_shorthand(self.policy_loss, PolicyLossConfig.KEY)
            object.__setattr__(self, "policy_loss", build_config(PolicyLossConfig, values))
        super().__post_init__()

    def check(self) -> None:
        super().check()
        refuse_unavailable(self, "freeze_vision_tower", "a vision tower to freeze (multimodal models are out of scope)")
        if self.strategy == "megatron":
            # the megatron actor runs megatron-core's own forward (its fused layers and schedules), not the module
            # call this switch wraps (use_fused_kernels runs in its output layer: verl.models.mcore.fused_head)
            refuse_unavailable(self, "use_torch_compile", "torch.compile of the megatron actor's forward")
        check_number(self, "tau_pos", 0.0, exclusive_min=True)
        check_number(self, "tau_neg", 0.0, exclusive_min=True)
        check_number(self, "loss_scale_factor", 0.0, exclusive_min=True)
        check_number(self, "clip_ratio", 0.0, exclusive_min=True)
        check_number(self, "clip_ratio_low", 0.0, exclusive_min=True)
        check_number(self, "clip_ratio_high", 0.0, exclusive_min=True)
        check_number(self, "clip_ratio_c", 1.0, exclusive_min=True)
        check_number(self, "kl_loss_coef", 0.0)


@dataclasses.dataclass(frozen=True)
class RefConfig(BaseConfig):
    """``actor_rollout_ref.ref``: the frozen reference model for KL terms."""

    KEY: ClassVar[str] = "actor_rollout_ref.ref"

    enable: bool | Literal["auto"]
    strategy: Strategy
    use_torch_compile: bool
    entropy_from_logits_with_chunking: bool
    log_prob_micro_batch_size_per_gpu: int | None
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    fsdp_config: RefFSDPConfig
    ulysses_sequence_parallel_size: int
    profiler: ProfilerConfig
    # the reference's megatron layout (strategy megatron); its sizes follow the actor's in the YAML
    megatron: MegatronConfig

    def check(self) -> None:
        check_ulysses(self)
        if self.strategy == "megatron":
            refuse_unavailable(self, "use_torch_compile", "torch.compile of the megatron reference's forward")
        check_int(self, "log_prob_micro_batch_size_per_gpu", 1)
        check_int(self, "log_prob_max_token_len_per_gpu", 1)

    def log_prob_micro_batching(self) -> MicroBatching:
        """How the reference's forward pass splits a batch."""
        return MicroBatching(
            self.log_prob_micro_batch_size_per_gpu, self.log_prob_use_dynamic_bsz, self.log_prob_max_token_len_per_gpu
        )


@dataclasses.dataclass(frozen=True)
class CriticConfig(TrainedModelConfig):
    """``critic``: the value model's training settings (same shared keys as the actor's, plus its own)."""

    KEY: ClassVar[str] = "critic"
    ROLE: ClassVar[str] = "critic"

    enable: bool | Literal["auto"]
    strategy: Strategy | None
    model: CriticModelConfig
    forward_micro_batch_size_per_gpu: int | None
    forward_max_token_len_per_gpu: int
    cliprange_value: float

    def check(self) -> None:
        super().check()
        check_int(self, "forward_micro_batch_size_per_gpu", 1)
        check_int(self, "forward_max_token_len_per_gpu", 1)
        check_number(self, "cliprange_value", 0.0, exclusive_min=True)
        if self.checkpoint.hf_model:
            raise FieldError(
                "checkpoint.save_contents",
                "holds 'hf_model': the critic has no Hugging Face export here (a value model is not a transformers "
                "causal LM); its checkpoint holds model.safetensors. Remove 'hf_model'.",
            )

    def forward_micro_batching(self) -> MicroBatching:
        """How the value pass (no gradients) splits a batch."""
        return MicroBatching(
            self.forward_micro_batch_size_per_gpu, self.use_dynamic_bsz, self.forward_max_token_len_per_gpu
        )
