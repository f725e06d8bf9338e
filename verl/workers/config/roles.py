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
from typing import Any, ClassVar, Literal

from verl.utils.micro_batching import MicroBatching
from verl.workers.config.compat import check_ulysses
from verl.workers.config.lora import MegatronLoraConfig, check_lora_fields
from verl.workers.config.megatron import MegatronConfig
from verl.workers.config.optim import OptimConfig
from verl.workers.config.out_of_scope import feature_message
from verl.workers.config.precision import (  # noqa: F401  (FSDP_STRATEGIES, check_fsdp_size: re-exported)
    FSDP_STRATEGIES,
    MixedPrecisionConfig,
    VerlDType,
    check_fsdp_size,
)
from verl.workers.config.profiler import ProfilerConfig
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


@dataclasses.dataclass(frozen=True)
class MtpConfig(BaseConfig):
    """``actor_rollout_ref.model.mtp``: verl's multi-token prediction (an MTP head trained with the policy, and
    speculative decoding with it in the rollout). Not built here: the switches stay false, and the other keys, read
    only with them, are refused when changed (``PPOConfig``'s check of settings nothing reads)."""

    enable: bool
    enable_train: bool
    enable_rollout: bool
    detach_encoder: bool
    mtp_loss_scaling_factor: float
    speculative_algorithm: str
    speculative_num_steps: int
    speculative_eagle_topk: int
    speculative_num_draft_tokens: int
    method: str
    num_speculative_tokens: int

    def check(self) -> None:
        for name in ("enable", "enable_train", "enable_rollout"):
            refuse_unavailable(self, name, MTP_REASON)


MTP_REASON = (
    "multi-token prediction (verl trains the model's MTP layers and drafts with them in the rollout), which the "
    "backends here do not build"
)


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
    # verl's activation offload: what the actor's update saves for its backward pass kept in CPU memory (fsdp2;
    # verl.utils.activation_offload)
    enable_activation_offload: bool
    # verl's multi-token prediction: off only (MtpConfig)
    mtp: MtpConfig

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


FSDP_ENGINE_STRATEGIES = ("fsdp", "fsdp2")


def check_fsdp_fields(section: Any) -> None:
    """The rules of verl's engine keys that FSDP sections share (``fsdp_size``, ``ulysses_sequence_parallel_size``)."""
    if section.strategy == "fsdp_turbo":
        raise FieldError("strategy", feature_message("fsdp_turbo", "=fsdp_turbo", "Set it to fsdp or fsdp2."))
    check_one_of(section, "strategy", FSDP_ENGINE_STRATEGIES, "both run on FSDP2 here")
    check_int(section, "fsdp_size", -1)
    if section.fsdp_size == 0:
        raise FieldError("fsdp_size", "=0 is not a group size: -1 shards over all ranks (verl's default).")
    check_ulysses(section)


def cpu_offload(fsdp_config: Any) -> bool:
    """Whether an FSDP2 model keeps its shards (and gradients, and the optimizer step) in CPU memory: verl's
    ``param_offload`` or its ``offload_policy`` (FSDP2's ``CPUOffloadPolicy``, what both mean on FSDP2 here)."""
    return bool(fsdp_config.param_offload or fsdp_config.offload_policy)


@dataclasses.dataclass(frozen=True)
class FSDPConfig(BaseConfig):
    """FSDP2 settings of a trained model (strategy ``fsdp2`` / ``fsdp``).

    ``model_dtype`` and ``mixed_precision`` are verl's precision keys; how they relate to the role's ``dtype``, and
    which combinations are refused, is :mod:`verl.workers.config.precision` (checked by
    :func:`~verl.workers.config.precision.fsdp_precision`, at start-up and again where the model is sharded).
    """

    param_offload: bool
    optimizer_offload: bool
    # verl's FSDP2 CPUOffloadPolicy switch: the same policy param_offload applies here (see :func:`cpu_offload`)
    offload_policy: bool
    reshard_after_forward: bool
    # verl's FSDP1 flat-parameter switch; FSDP2 has no flat parameters, so both values mean what true means
    use_orig_params: bool
    forward_prefetch: bool
    # dtype of the loaded weights and the shards (the master copy); null: fp32
    model_dtype: VerlDType | None
    mixed_precision: MixedPrecisionConfig
    wrap_policy: WrapPolicyConfig
    # ranks one copy of the model is sharded over: -1 (or the world size) only, see :func:`check_fsdp_size`
    fsdp_size: int
    # verl's engine-level spelling of the role's ulysses_sequence_parallel_size: 1 only (check_ulysses)
    ulysses_sequence_parallel_size: int
    # verl's engine-level spelling of the role's entropy_checkpointing: true in either place recomputes
    entropy_checkpointing: bool
    # verl's engine switch: the entropy computed by torch.compile(entropy_from_logits, dynamic=True) (the actor's)
    use_torch_compile: bool
    # verl's engine choice, FSDP1 (fsdp) or FSDP2 (fsdp2): both run on FSDP2 here (fsdp_turbo: refused by name)
    strategy: str

    def check(self) -> None:
        check_fsdp_fields(self)


@dataclasses.dataclass(frozen=True)
class RefFSDPConfig(BaseConfig):
    """FSDP2 settings of the frozen reference model (no optimizer, so nothing of it to offload); its precision keys
    as :class:`FSDPConfig`'s, with the actor's ``dtype`` as the compute dtype."""

    param_offload: bool
    # verl's key, inherited from the trained models' engine section: a frozen model has no optimizer state, so true
    # moves nothing (logged)
    optimizer_offload: bool
    offload_policy: bool
    reshard_after_forward: bool
    forward_prefetch: bool
    model_dtype: VerlDType | None
    mixed_precision: MixedPrecisionConfig
    fsdp_size: int
    ulysses_sequence_parallel_size: int
    # no gradients flow through the reference: nothing to recompute, whatever the value
    entropy_checkpointing: bool
    # verl's engine switch (compiled entropy); the reference's passes compute no entropy
    use_torch_compile: bool
    strategy: str

    def check(self) -> None:
        check_fsdp_fields(self)
        if self.optimizer_offload:
            logger.info("ref.fsdp_config.optimizer_offload=true: the frozen reference has no optimizer state to move")


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
    enable_activation_offload: bool

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
#: state (with the fp16 loss scaler), the rest of the training state (LR schedule, update-failure counters), and
#: optionally a Hugging Face export.
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
#: The parts of the training state a checkpoint may leave out, and that a resume may leave fresh.
TRAINING_STATE_PARTS = ("optimizer", "extra")
ASYNC_SAVE_REASON = (
    "background checkpoint writes are not built here: a checkpoint is written in place, atomically (a temporary "
    "directory renamed when complete) and read back by the driver before training goes on, which a write still in "
    "flight would defeat"
)


@dataclasses.dataclass(frozen=True)
class CheckpointContentsConfig(BaseConfig):
    """``<role>.checkpoint``: what each checkpoint writes and what a resume reads (verl's meaning).

    ``model`` (the weights) is always written and read: every resume starts from them. ``optimizer`` and ``extra``
    may be left out of a checkpoint (smaller files; a resume from it is then not exact) and out of a resume (that
    part starts fresh); a resume that asks for a part its checkpoint lacks stops with an error naming it.
    ``hf_model`` adds a ``huggingface/`` directory that ``transformers`` loads (a LoRA run: the merged weights); it
    is never read back.
    """

    save_contents: list[str]
    load_contents: list[str]
    # verl's background checkpoint writes (megatron): false only
    async_save: bool
    # verl: whether megatron's Hugging Face export must map every weight. The exports here map every weight of the
    # models they convert (a weight left over is an error either way), so true and false write the same files.
    strict: bool

    def check(self) -> None:
        for field, what in (("save_contents", "a checkpoint holds"), ("load_contents", "a resume reads")):
            values = list(getattr(self, field))
            unknown = [item for item in values if item not in CHECKPOINT_CONTENTS]
            if unknown:
                raise FieldError(field, f"holds {unknown[0]!r}; each entry is one of {list(CHECKPOINT_CONTENTS)}.")
            if "model" not in values:
                raise FieldError(
                    field,
                    f"={values} leaves out 'model': {what} the trained weights here, which every resume starts from "
                    "(a checkpoint without them could not be resumed). Add 'model'.",
                )
        refuse_unavailable(self, "async_save", ASYNC_SAVE_REASON)

    @property
    def hf_model(self) -> bool:
        """Whether each checkpoint also writes the ``huggingface/`` export."""
        return "hf_model" in self.save_contents

    @property
    def saved_parts(self) -> tuple[str, ...]:
        """The parts of the training state each checkpoint writes (of :data:`TRAINING_STATE_PARTS`)."""
        return tuple(part for part in TRAINING_STATE_PARTS if part in self.save_contents)

    @property
    def loaded_parts(self) -> tuple[str, ...]:
        """The parts of the training state a resume reads (of :data:`TRAINING_STATE_PARTS`)."""
        return tuple(part for part in TRAINING_STATE_PARTS if part in self.load_contents)


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
    # verl's role-level spelling of optim.clip_grad (its YAML default follows optim.clip_grad); when the two differ,
    # grad_clip is the one applied, as in verl. Folded into optim.clip_grad when the section is built (then null).
    grad_clip: float | None

    def __post_init__(self) -> None:
        self._fold_megatron_dtype()
        super().__post_init__()
        if self.grad_clip is not None:
            if self.grad_clip != self.optim.clip_grad:
                logger.info("%s.grad_clip=%s sets optim.clip_grad", self.KEY, self.grad_clip)
                object.__setattr__(self, "optim", self.optim.replace(clip_grad=self.grad_clip))
            # folded: a later replace(optim=...) must not be undone by a stale copy
            object.__setattr__(self, "grad_clip", None)

    def _fold_megatron_dtype(self) -> None:
        """verl's ``megatron.dtype`` (the megatron engine's dtype): on a megatron role, when set, the role's dtype;
        then null, so that a later ``replace(dtype=...)`` is not undone by a stale copy."""
        engine_dtype = getattr(self.megatron, "dtype", None)
        if engine_dtype is None or getattr(self, "strategy", None) != "megatron":
            return
        if engine_dtype != self.dtype:
            logger.info("%s.megatron.dtype=%s sets %s.dtype (was %s)", self.KEY, engine_dtype, self.KEY, self.dtype)
            object.__setattr__(self, "dtype", engine_dtype)
        object.__setattr__(self, "megatron", self.megatron.replace(dtype=None))

    def check(self) -> None:
        check_ulysses(self)
        check_number(self, "grad_clip")
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

    from verl.workers.config.composition import compose_omegaconf

    # composed, not read from one file: the sections live in component files (actor/actor.yaml, ...)
    return OmegaConf.to_container(OmegaConf.select(compose_omegaconf(()), key), resolve=True)


def trainer_yaml_section(key: str) -> dict[str, Any]:
    """A copy of the section ``key`` (dotted) of the composed ``ppo_trainer.yaml``: the defaults a shorthand or a
    preset fills in, read from the YAML that holds them."""
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
    # SAPO's temperatures, also spelt here by verl's scripts; null: the actor's tau_pos / tau_neg. A value set here
    # is the one SAPO uses (ActorConfig.__post_init__ copies it to the actor's key).
    tau_pos: float | None
    tau_neg: float | None

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
        check_number(self, "tau_pos", 0.0, exclusive_min=True)
        check_number(self, "tau_neg", 0.0, exclusive_min=True)
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


SUM_PI_SQUARED_REASON = (
    "the per-token sum of squared probabilities (sum_pi_squared) that verl's optimal_token_baseline estimators read; "
    "the actor here does not compute it, and those estimators are refused (algorithm.adv_estimator)"
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
    # verl: also compute sum_pi_squared (the per-token sum of squared probabilities) for the optimal-token-baseline
    # estimators; false only (this trainer does not compute it yet)
    calculate_sum_pi_squared: bool

    def __post_init__(self) -> None:
        # a bare loss name or a mapping handed to the constructor (replace(policy_loss="gspo")) becomes the section
        if isinstance(self.policy_loss, str | Mapping):
            values = PolicyLossConfig.from_shorthand(self.policy_loss, PolicyLossConfig.KEY)
            object.__setattr__(self, "policy_loss", build_config(PolicyLossConfig, values))
        self._fold_policy_loss_taus()
        super().__post_init__()

    def _fold_policy_loss_taus(self) -> None:
        """verl's ``policy_loss.tau_pos`` / ``tau_neg`` spelling: copied to the actor's keys (the ones SAPO reads),
        then null, so that a later ``replace(tau_pos=...)`` is not undone by a stale copy."""
        taus = {name: getattr(self.policy_loss, name, None) for name in ("tau_pos", "tau_neg")}
        taus = {name: value for name, value in taus.items() if value is not None}
        for name, value in taus.items():
            object.__setattr__(self, name, value)
        if taus:
            object.__setattr__(self, "policy_loss", self.policy_loss.replace(**dict.fromkeys(taus)))

    @property
    def checkpoints_entropy(self) -> bool:
        """Whether the entropy's intermediates are recomputed in the backward pass: ``entropy_checkpointing`` here
        or in ``fsdp_config`` (verl's engine spelling of the same switch)."""
        return self.entropy_checkpointing or self.fsdp_config.entropy_checkpointing

    def check(self) -> None:
        super().check()
        refuse_unavailable(self, "freeze_vision_tower", "a vision tower to freeze (multimodal models are out of scope)")
        check_number(self, "tau_pos", 0.0, exclusive_min=True)
        check_number(self, "tau_neg", 0.0, exclusive_min=True)
        refuse_unavailable(self, "calculate_sum_pi_squared", SUM_PI_SQUARED_REASON)
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
    # verl's key: the reference computes no gradients, so there is nothing to recompute whatever the value
    entropy_checkpointing: bool
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
        check_int(self, "log_prob_micro_batch_size_per_gpu", 1)
        check_int(self, "log_prob_max_token_len_per_gpu", 1)

    def log_prob_micro_batching(self) -> MicroBatching:
        """How the reference's forward pass splits a batch."""
        return MicroBatching(
            self.log_prob_micro_batch_size_per_gpu, self.log_prob_use_dynamic_bsz, self.log_prob_max_token_len_per_gpu
        )


@dataclasses.dataclass(frozen=True)
class CriticFSDPConfig(BaseConfig):
    """``critic.fsdp``: verl's newer name of the critic's FSDP engine section, for the offload switches verl's
    scripts set there. Its YAML values follow ``critic.model.fsdp_config``; true in either place offloads
    (:meth:`CriticConfig.__post_init__` folds these into ``critic.model.fsdp_config``)."""

    param_offload: bool
    optimizer_offload: bool


@dataclasses.dataclass(frozen=True)
class CriticConfig(TrainedModelConfig):
    """``critic``: the value model's training settings (same shared keys as the actor's, plus its own)."""

    KEY: ClassVar[str] = "critic"
    ROLE: ClassVar[str] = "critic"

    enable: bool | Literal["auto"]
    strategy: Strategy | None
    model: CriticModelConfig
    fsdp: CriticFSDPConfig
    forward_micro_batch_size_per_gpu: int | None
    forward_max_token_len_per_gpu: int
    cliprange_value: float

    def __post_init__(self) -> None:
        super().__post_init__()
        fsdp_config = self.model.fsdp_config
        switches = {name: True for name in ("param_offload", "optimizer_offload") if getattr(self.fsdp, name)}
        if any(not getattr(fsdp_config, name) for name in switches):
            # critic.fsdp.<switch>=true: the value critic.model.fsdp_config (the section the builders read) takes
            model = self.model.replace(fsdp_config=fsdp_config.replace(**switches))
            object.__setattr__(self, "model", model)

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
