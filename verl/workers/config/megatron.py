"""The ``megatron`` sections (``actor_rollout_ref.actor.megatron``, ``actor_rollout_ref.ref.megatron``,
``critic.megatron``) and ``optim.override_optimizer_config``: verl's megatron keys with their meaning here.

One dataclass, :class:`MegatronConfig`, serves the three sections, as verl's ``McoreEngineConfig`` does: the
model-parallel layout (tensor, pipeline, expert, context, virtual pipeline sizes; sequence parallel), the training
path (:meth:`MegatronConfig.training_path`), the offload switches, megatron-core's distributed checkpoints as the
source of the initial weights, the converter choice (``use_mbridge``) and the pass-through dictionaries into
megatron-core's ``TransformerConfig`` and ``DistributedDataParallelConfig``. Every pass-through key is checked
against the fields of megatron-core's dataclass at start-up (:func:`check_passthrough_keys`): an unknown key is
refused with the close matches, a key that another config key or the Hugging Face model already decides is
refused with the key to set instead. What needs CUDA is refused on CPU (:meth:`MegatronConfig.training_path`);
what runs differently there is logged (:meth:`MegatronConfig.check_device`).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import logging
from collections.abc import Mapping
from typing import Any, Literal

from verl.workers.config.schema import BaseConfig, FieldError, check_int, is_int, join_key, refuse_unavailable

logger = logging.getLogger(__name__)

# TransformerConfig fields the HF -> megatron converter derives from the Hugging Face config: overriding one would
# build a model the converted weights do not fit (or that computes something else than the HF model).
TRANSFORMER_FIELDS_FROM_MODEL = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "normalization",
    "layernorm_epsilon",
    "gated_linear_unit",
    "activation_func",
    "add_bias_linear",
    "add_qkv_bias",
    "init_method_std",
    "use_cpu_initialization",
)

# TransformerConfig fields that another config key sets: the key to use instead.
TRANSFORMER_FIELDS_FROM_KEYS = {
    "tensor_model_parallel_size": "megatron.tensor_model_parallel_size",
    "pipeline_model_parallel_size": "megatron.pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size": "megatron.virtual_pipeline_model_parallel_size",
    "context_parallel_size": "megatron.context_parallel_size",
    "expert_model_parallel_size": "megatron.expert_model_parallel_size",
    "expert_tensor_parallel_size": "megatron.expert_tensor_parallel_size",
    "sequence_parallel": "megatron.sequence_parallel",
    "fp16": "dtype",
    "bf16": "dtype",
    "params_dtype": "dtype",
    "pipeline_dtype": "dtype",
}

# Kernel fusions that need apex / Transformer Engine CUDA kernels; on CPU they are logged and the unfused paths run
# (the same numbers).
CUDA_KERNEL_FUSIONS = (
    "masked_softmax_fusion",
    "bias_activation_fusion",
    "bias_dropout_fusion",
    "apply_rope_fusion",
    "gradient_accumulation_fusion",
    "persist_layer_norm",
)

# Mixture-of-experts options: the megatron backend builds dense Llama / Qwen2 models (an MoE architecture is refused
# when its config is read), so these have nothing to act on; checked by name, logged, and not passed on (some, like
# moe_permute_fusion, make TransformerConfig ask for Transformer Engine even without experts).
MOE_PREFIX = "moe_"
# How layers are shared out over pipeline stages: with one stage there is nothing to share out (megatron-core would
# still build the first stage's count of layers), so at pipeline size 1 these are logged and not passed on.
PIPELINE_SPLIT_FIELDS = (
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "pipeline_model_parallel_layout",
)

# Fields verl's scripts pass into TransformerConfig for Ascend NPUs: MindSpeed's extensions of megatron-core's
# TransformerConfig (megatron-core itself has no such fields). Off (false / null) they change nothing and are left out
# (logged); on they are refused with this reason.
NPU_TRANSFORMER_EXTENSIONS = (
    "use_flash_attn",
    "use_naive_l2norm",
    "use_fused_swiglu",
    "use_fused_rmsnorm",
    "use_triton_gdn",
    "use_ascend_gdn",
)
NPU_EXTENSION_REASON = (
    "a MindSpeed (Ascend NPU) extension of megatron-core's TransformerConfig; NPU hardware and MindSpeed are out of "
    "scope here, and megatron-core's own TransformerConfig has no such field"
)
MEGATRON_FSDP_REASON = (
    "Megatron-FSDP (megatron-core's ZeRO-3 sharding of the model's parameters) is not built here; "
    "use_distributed_optimizer shards the optimizer state over the data-parallel ranks"
)
# megatron-core's recompute_modules of a dense layer, and its others (parts of mixture-of-experts or
# multi-latent-attention layers, which the models here do not have).
DENSE_RECOMPUTE_MODULES = ("core_attn", "mlp", "layernorm")
MOE_MLA_RECOMPUTE_MODULES = ("moe", "moe_act", "shared_experts", "mla_up_proj")
REMOVE_PADDING_NOTE = (
    "the megatron backend here runs padded rows with their attention mask, not verl's packed (thd) sequences; the "
    "log-probs and the loss are the same either way"
)

# OptimizerConfig fields the ``optim`` section sets (AdamW, clipping, fp16 loss scale) or the dtype decides.
OPTIMIZER_FIELDS_FROM_KEYS = {
    "optimizer": "optim.optimizer",
    "lr": "optim.lr",
    "min_lr": "optim.min_lr (or optim.min_lr_ratio)",
    "weight_decay": "optim.weight_decay",
    "adam_beta1": "optim.betas",
    "adam_beta2": "optim.betas",
    "adam_eps": "optim.eps",
    "clip_grad": "optim.clip_grad",
    "initial_loss_scale": "optim.initial_loss_scale",
    "min_loss_scale": "optim.min_loss_scale",
    "loss_scale_window": "optim.loss_scale_window",
    "hysteresis": "optim.hysteresis",
    "fp16": "dtype",
    "bf16": "dtype",
    "params_dtype": "dtype",
    "use_distributed_optimizer": "megatron.use_distributed_optimizer",
}

# OptimizerConfig options that move optimizer state to host memory: where the adapter trains on CPU, it is there.
HOST_MEMORY_OPTIMIZER_OPTIONS = frozenset(
    {
        "optimizer_cpu_offload",
        "optimizer_offload_fraction",
        "overlap_cpu_optimizer_d2h_h2d",
        "pin_cpu_grads",
        "pin_cpu_params",
    }
)
# The state dtypes of use_precision_aware_optimizer (float32 by default: then it computes what the adapter does).
PRECISION_AWARE_DTYPES = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")

# DistributedDataParallelConfig fields this package sets itself.
DDP_FIELDS_FROM_KEYS = {"use_distributed_optimizer": "megatron.use_distributed_optimizer"}


def check_npu_extensions(overrides: Any, key: str) -> None:
    """The MindSpeed (Ascend NPU) fields of ``override_transformer_config``: off is accepted (and left out, logged),
    on is refused with :data:`NPU_EXTENSION_REASON`.

    Raises:
        FieldError: one of :data:`NPU_TRANSFORMER_EXTENSIONS` set to a true value.
    """
    if not isinstance(overrides, Mapping):
        return
    given = {name: overrides[name] for name in NPU_TRANSFORMER_EXTENSIONS if name in overrides}
    for name, value in given.items():
        if value:
            raise FieldError(f"{key}.{name}", f"={value!r} is {NPU_EXTENSION_REASON}. Remove it (or set it to false).")
    if given:
        logger.info("%s: %s are off; MindSpeed (NPU) fields, not passed to TransformerConfig", key, sorted(given))


def megatron_core_installed() -> bool:
    return importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None


def _dataclass_fields(kind: str) -> set[str]:
    """The field names of megatron-core's ``TransformerConfig``, ``OptimizerConfig`` or DDP config."""
    if kind == "transformer":
        from megatron.core.transformer import TransformerConfig as cls
    elif kind == "optimizer":
        from megatron.core.optimizer import OptimizerConfig as cls
    else:
        from megatron.core.distributed import DistributedDataParallelConfig as cls
    return {field.name for field in dataclasses.fields(cls)}


_DATACLASS_NAMES = {
    "transformer": "megatron-core's TransformerConfig",
    "optimizer": "megatron-core's OptimizerConfig",
    "ddp": "megatron-core's DistributedDataParallelConfig",
}


def check_recompute(given: Mapping[str, Any]) -> None:
    """megatron-core's rules for ``override_transformer_config.recompute_*`` (its ``TransformerConfig`` checks them
    when the model is built, inside a worker), checked at start-up instead.

    Raises:
        FieldError: a value megatron-core refuses, or (``selective``) modules that are not a dense layer's.
    """
    field = "override_transformer_config.recompute_"
    granularity, method = given.get("recompute_granularity"), given.get("recompute_method")
    num_layers, modules = given.get("recompute_num_layers"), given.get("recompute_modules")
    modules = ["core_attn"] if modules is None else list(modules)  # megatron-core's default
    if granularity not in (None, "full", "selective"):
        raise FieldError(f"{field}granularity", f"={granularity!r} is not supported; use null, full or selective.")
    if granularity == "full" and (method not in ("uniform", "block") or not is_int(num_layers) or num_layers < 1):
        raise FieldError(
            f"{field}granularity",
            f"=full recomputes groups of whole layers: set recompute_method to uniform or block (got {method!r}) and "
            f"recompute_num_layers to an integer >= 1 (got {num_layers!r}); verl's scripts set uniform and 1.",
        )
    if granularity != "selective":
        return
    if num_layers is not None:
        raise FieldError(f"{field}num_layers", f"={num_layers!r} must be null with recompute_granularity=selective.")
    others = [name for name in modules if name not in DENSE_RECOMPUTE_MODULES]
    if others or not modules:
        raise FieldError(
            f"{field}modules",
            f"={modules!r}: selective recomputation of these dense models takes some of "
            f"{list(DENSE_RECOMPUTE_MODULES)} (megatron-core's other names, {list(MOE_MLA_RECOMPUTE_MODULES)}, are "
            "parts of mixture-of-experts or multi-latent-attention layers, which these models do not have).",
        )


def check_passthrough_keys(overrides: Any, kind: str, key: str, decided_by: Mapping[str, str]) -> dict[str, Any]:
    """The keys of a pass-through dictionary, each checked against the fields of megatron-core's dataclass.

    Args:
        overrides: the dictionary from the YAML (null counts as empty).
        kind: "transformer", "optimizer" or "ddp": which megatron-core dataclass it goes to.
        key: its full config key, for messages.
        decided_by: fields that another key sets -> that key (refused here, with it named).

    Returns:
        The dictionary as a plain dict.

    Raises:
        FieldError: not a mapping; a key that is no field of the dataclass (the close matches named); a key that
            another config key decides.
    """
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise FieldError(key, f"must be a mapping of {_DATACLASS_NAMES[kind]} fields to values, got {overrides!r}.")
    # Without megatron-core the names cannot be checked; only the megatron backend reads them, and choosing it without
    # megatron-core installed is refused on its own (check_megatron_sections). A dp / fsdp2 run needs no megatron-core.
    fields = _dataclass_fields(kind) if overrides and megatron_core_installed() else None
    for name in overrides:
        if fields is not None and name not in fields:
            close = difflib.get_close_matches(str(name), sorted(fields), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see megatron-core's documentation."
            raise FieldError(f"{key}.{name}", f"is not a field of {_DATACLASS_NAMES[kind]} (megatron-core 0.16){hint}")
        if name in decided_by:
            raise FieldError(
                f"{key}.{name}",
                f"is decided by {decided_by[name]}: set that instead (the override would disagree with it).",
            )
    return dict(overrides)


@dataclasses.dataclass(frozen=True)
class RouterReplayConfig(BaseConfig):
    """``megatron.router_replay``: verl's replay of a mixture-of-experts model's routing decisions (R2: recorded in
    training, R3: recorded in the rollout). The megatron backend here builds dense models, so ``disabled`` only."""

    mode: Literal["disabled", "R2", "R3"]
    record_file: str | None
    replay_file: str | None

    def check(self) -> None:
        if self.mode != "disabled":
            raise FieldError(
                "mode",
                f"={self.mode}: router replay records and replays a mixture-of-experts model's routing; the megatron "
                "backend here builds dense Llama / Qwen2 models (no experts to route). Set it to disabled.",
            )
        for name in ("record_file", "replay_file"):
            if getattr(self, name) is not None:
                raise FieldError(name, "is read with a router replay mode only (mode=disabled here); leave it null.")


@dataclasses.dataclass(frozen=True)
class MegatronConfig(BaseConfig):
    """A megatron section: model-parallel layout, training path, offload, checkpoints and pass-throughs.

    See ``ppo_trainer.yaml`` (``actor_rollout_ref.actor.megatron``) for each key and docs/advance/backends.md for
    what each means here.
    """

    param_offload: bool
    grad_offload: bool
    optimizer_offload: bool
    tensor_model_parallel_size: int
    expert_model_parallel_size: int
    expert_tensor_parallel_size: int | None
    pipeline_model_parallel_size: int
    virtual_pipeline_model_parallel_size: int | None
    context_parallel_size: int
    sequence_parallel: bool
    use_distributed_optimizer: bool
    use_dist_checkpointing: bool
    dist_checkpointing_path: str | None
    dist_checkpointing_prefix: str
    seed: int
    override_ddp_config: Any
    override_transformer_config: Any
    use_mbridge: bool
    vanilla_mbridge: bool
    use_megatron_optimizer: bool | Literal["auto"]
    # verl's packed (thd) sequences (true, verl's default) or padded rows (false): see REMOVE_PADDING_NOTE
    use_remove_padding: bool
    # verl's engine dtype; null: the role's dtype. Set, it is the role's dtype (ActorConfig / CriticConfig fold it in)
    dtype: Literal["bfloat16", "float16", "float32"] | None
    # verl's Megatron-FSDP: false only (MEGATRON_FSDP_REASON)
    use_megatron_fsdp: bool
    # verl's router replay of mixture-of-experts models: mode disabled only (RouterReplayConfig)
    router_replay: RouterReplayConfig

    def check(self) -> None:
        refuse_unavailable(self, "use_megatron_fsdp", MEGATRON_FSDP_REASON)
        check_int(self, "tensor_model_parallel_size", 1)
        check_int(self, "pipeline_model_parallel_size", 1)
        check_int(self, "expert_model_parallel_size", 1)
        check_int(self, "expert_tensor_parallel_size", 1)
        check_int(self, "virtual_pipeline_model_parallel_size", 1)
        check_int(self, "context_parallel_size", 1)
        check_int(self, "seed", 0)
        self._check_layout()
        if self.use_dist_checkpointing and not self.dist_checkpointing_path:
            raise FieldError(
                "dist_checkpointing_path",
                "is empty, and use_dist_checkpointing=true loads the initial weights from it: set it to a "
                "megatron-core distributed checkpoint (python -m verl.models.mcore.dist_checkpoint converts a "
                "Hugging Face model into one), or set use_dist_checkpointing=false.",
            )

    def _check_layout(self) -> None:
        if self.expert_model_parallel_size > 1:
            raise FieldError(
                "expert_model_parallel_size",
                f"={self.expert_model_parallel_size}: expert parallelism splits a mixture-of-experts model's "
                "experts, and the megatron backend converts dense Llama / Qwen2 models only (no experts to split). "
                "Set it to 1.",
            )
        etp = self.expert_tensor_parallel_size
        if etp is not None and etp not in (1, self.tensor_model_parallel_size):
            raise FieldError(
                "expert_tensor_parallel_size",
                f"={etp}: it sets the tensor-parallel size of experts, and the megatron backend converts dense "
                "models only. Leave it null (or 1).",
            )
        if self.context_parallel_size > 1:
            raise FieldError(
                "context_parallel_size",
                f"={self.context_parallel_size}: context parallelism (each rank holding a slice of every sequence, "
                "attention by Transformer Engine's ring exchange on CUDA) is not built here. Set it to 1 and "
                "scale with tensor_model_parallel_size or more data-parallel ranks.",
            )
        vpp = self.virtual_pipeline_model_parallel_size
        if vpp is not None and vpp > 1:
            raise FieldError(
                "virtual_pipeline_model_parallel_size",
                f"={vpp}: the interleaved pipeline schedule (several model chunks per pipeline rank) is not built "
                "here; each pipeline rank holds one chunk. Set it to null.",
            )

    def check_passthroughs(self, key: str) -> None:
        """Check the pass-through dictionaries' keys against megatron-core's dataclasses (importing megatron-core):
        for the sections a megatron role reads only (:func:`check_megatron_sections`), so that a run on another
        backend neither needs megatron-core nor pays for its import. ``key`` is the section's, for messages.

        Raises:
            ValueError: as :func:`check_passthrough_keys`, naming the full key.
        """
        try:
            self._check_passthroughs()
        except FieldError as err:
            raise ValueError(join_key(f"{key}.{err.field}", err.detail)) from None

    def _check_passthroughs(self) -> None:
        check_npu_extensions(self.override_transformer_config, "override_transformer_config")
        check_recompute(dict(self._megatron_core_items() or {}))
        transformer = check_passthrough_keys(
            self._megatron_core_items(),
            "transformer",
            "override_transformer_config",
            {
                **dict.fromkeys(TRANSFORMER_FIELDS_FROM_MODEL, "the Hugging Face model's config"),
                **TRANSFORMER_FIELDS_FROM_KEYS,
            },
        )
        split = sorted(name for name in transformer if name in PIPELINE_SPLIT_FIELDS)
        if split and self.pipeline_model_parallel_size == 1:
            logger.info(
                "override_transformer_config: %s share layers out over pipeline stages; with "
                "pipeline_model_parallel_size=1 there is one stage: not passed to TransformerConfig",
                ", ".join(split),
            )
        moe = sorted(name for name in transformer if name.startswith(MOE_PREFIX))
        if moe:
            logger.info(
                "override_transformer_config: %s have no effect: the megatron backend builds dense Llama / Qwen2 "
                "models (no experts); not passed to TransformerConfig",
                ", ".join(moe),
            )
        check_passthrough_keys(self.override_ddp_config, "ddp", "override_ddp_config", DDP_FIELDS_FROM_KEYS)

    def pipeline_split(self) -> dict[str, Any]:
        """The ``override_transformer_config`` entries that share the layers out over the pipeline stages."""
        return {name: value for name, value in self._transformer_items() if name in PIPELINE_SPLIT_FIELDS}

    def check_fits(self, hf_config: Any, key: str) -> None:
        """Refuse a tensor-parallel size or pipeline layout of this section (``key``) that the model of ``hf_config``
        cannot be split by (heads and query groups that do not split evenly, layers that do not share out over the
        stages); the driver checks it before Ray starts, the builders again when they build the model."""
        from verl.models.mcore.pipeline import check_pipeline_fits
        from verl.models.mcore.tensor_parallel import check_tensor_parallel_fits

        check_tensor_parallel_fits(hf_config, self.tensor_model_parallel_size, f"{key}.tensor_model_parallel_size")
        check_pipeline_fits(
            hf_config, self.pipeline_model_parallel_size, f"{key}.pipeline_model_parallel_size", self.pipeline_split()
        )

    @property
    def model_parallel_size(self) -> int:
        """Over how many ranks one copy of the model is split: tensor-parallel ranks x pipeline stages."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size

    @property
    def checkpoint_is_collective(self) -> bool:
        """Whether every rank takes part in a save: the model is split over ranks, or megatron-core's distributed
        optimizer spreads its state over the data-parallel ranks."""
        return self.model_parallel_size > 1 or self.use_distributed_optimizer

    def same_layout(self, other: MegatronConfig) -> bool:
        """Whether two sections split a model alike (megatron-core keeps one set of groups per process)."""
        names = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")
        return all(getattr(self, name) == getattr(other, name) for name in names)

    def transformer_overrides(self, device_type: str) -> dict[str, Any]:
        """The ``TransformerConfig`` fields this section decides, for the model builder.

        ``sequence_parallel`` (verl's default true) splits the activations of the layer norms along the sequence
        over the tensor-parallel ranks; megatron-core allows it only with tensor parallelism, and it runs on CUDA
        (its reduce-scatter), so it is on where both hold. ``override_transformer_config`` follows, with
        ``attention_backend`` turned into megatron-core's enum and the ``moe_*`` options left out (dense models), the
        pipeline-split fields at pipeline size 1, and on CPU the CUDA kernel fusions (the unfused paths compute the
        same numbers).

        Args:
            device_type: "cpu" or "cuda".

        Returns:
            Keyword arguments for :func:`verl.models.mcore.build_transformer_config`.
        """
        overrides: dict[str, Any] = {
            "sequence_parallel": self.sequence_parallel
            and self.tensor_model_parallel_size > 1
            and device_type == "cuda"
        }
        for name, value in self._transformer_items():
            if self._left_out(name, device_type):
                continue
            if name == "attention_backend" and isinstance(value, str):
                from megatron.core.transformer.enums import AttnBackend

                value = AttnBackend[value]
            overrides[name] = list(value) if isinstance(value, tuple) else value
        return overrides

    def _left_out(self, name: str, device_type: str) -> bool:
        """Whether an ``override_transformer_config`` field stays out of ``TransformerConfig`` (the checks log it):
        a ``moe_*`` option (dense models), a pipeline-split field at one stage, a CUDA kernel fusion off CUDA."""
        return (
            name.startswith(MOE_PREFIX)
            or (name in PIPELINE_SPLIT_FIELDS and self.pipeline_model_parallel_size == 1)
            or (device_type != "cuda" and name in CUDA_KERNEL_FUSIONS)
        )

    def _megatron_core_items(self) -> dict[str, Any]:
        """``override_transformer_config`` without the (off) MindSpeed extensions, which megatron-core lacks."""
        given = self.override_transformer_config
        if not isinstance(given, Mapping):
            return given
        return {name: value for name, value in given.items() if name not in NPU_TRANSFORMER_EXTENSIONS}

    def _transformer_items(self) -> list[tuple[str, Any]]:
        return list(dict(self._megatron_core_items() or {}).items())

    def ddp_overrides(self) -> dict[str, Any]:
        """``DistributedDataParallelConfig`` fields from ``override_ddp_config`` (megatron-core's path, CUDA)."""
        return dict(self.override_ddp_config or {})

    def check_device(self, device_type: str, key: str, *, trainable: bool = True) -> None:
        """Refuse what this model cannot do, naming the key and saying why; log what CUDA kernel fusions and offload
        mean on CPU (activation recomputation runs there by torch's checkpoint: :mod:`verl.models.mcore.recompute`).

        Args:
            device_type: "cpu" or "cuda".
            key: the section's full key (``actor_rollout_ref.actor.megatron``).
            trainable: False for the frozen reference (it has no gradients or optimizer to offload).

        Raises:
            ValueError: gradient or optimizer offload of the frozen reference.
        """
        if not trainable:
            for name in ("grad_offload", "optimizer_offload"):
                if getattr(self, name):
                    raise ValueError(
                        f"{key}.{name}=true: the reference model is frozen, it has no gradients or optimizer state "
                        f"to offload. Set it to false (param_offload applies to the reference)."
                    )
        if device_type == "cuda":
            return
        fused = [name for name, value in self._transformer_items() if name in CUDA_KERNEL_FUSIONS and value]
        if fused:
            logger.info(
                "%s.override_transformer_config: %s ask for apex / Transformer Engine CUDA kernels; on CPU the "
                "unfused paths run (the same numbers)",
                key,
                ", ".join(f"{name}=true" for name in fused),
            )
        offloads = [name for name in ("param_offload", "grad_offload", "optimizer_offload") if getattr(self, name)]
        if offloads:
            logger.info(
                "%s: %s on CPU: parameters, gradients and optimizer state already live in host memory; nothing moves",
                key,
                ", ".join(f"{name}=true" for name in offloads),
            )

    def training_path(self, device_type: str, key: str, *, has_megatron_optimizer_path: bool = True) -> bool:
        """Whether to train with megatron-core's optimizer, DDP and schedules (else the torch.optim adapter).

        ``auto`` takes megatron-core's path on CUDA and the adapter on CPU. A model without a megatron-core
        optimizer path (``has_megatron_optimizer_path=False``, the critic today) always takes the adapter.

        Args:
            device_type: "cpu" or "cuda".
            key: the section's full key, for messages (``actor_rollout_ref.actor.megatron``).
            has_megatron_optimizer_path: whether the model can train on megatron-core's optimizer at all.

        Raises:
            ValueError: megatron-core's optimizer without CUDA or where the model lacks that path, or its distributed
                optimizer on the adapter path.
        """
        choice = self.use_megatron_optimizer
        on_cuda = device_type == "cuda"
        if choice is True and not has_megatron_optimizer_path:
            raise ValueError(
                f"{key}.use_megatron_optimizer=true: this model has no megatron-core optimizer path yet; set it to "
                f"auto or false (the torch.optim adapter)."
            )
        if choice is True and not on_cuda:
            raise ValueError(
                f"{key}.use_megatron_optimizer=true needs CUDA: megatron-core's optimizer, DDP and schedules are "
                f"CUDA-only. Use auto (the torch.optim adapter on CPU) or run with trainer.device=cuda."
            )
        use_megatron = has_megatron_optimizer_path and (on_cuda if choice == "auto" else bool(choice))
        if choice == "auto" and on_cuda and not has_megatron_optimizer_path:
            logger.warning("%s: no megatron-core optimizer path for this model yet; using the torch.optim adapter", key)
        if not use_megatron and self.use_distributed_optimizer:
            raise ValueError(
                f"{key}.use_distributed_optimizer=true shards megatron-core's optimizer state over the data-parallel "
                "ranks, and this model trains on the torch.optim adapter (CPU, or use_megatron_optimizer=false). "
                "Set it to false, or train on megatron-core's path (CUDA, use_megatron_optimizer=auto)."
            )
        return use_megatron


def check_optimizer_overrides(
    overrides: Any, key: str, *, uses_megatron_optimizer: bool | None, device_type: str | None = None
) -> dict[str, Any]:
    """``optim.override_optimizer_config`` of a megatron model: keys checked against ``OptimizerConfig``.

    On the torch.optim adapter two kinds of option already hold and are accepted (logged): the host-memory ones
    on CPU (:data:`HOST_MEMORY_OPTIMIZER_OPTIONS`: the optimizer state lives in host memory there), and
    ``use_precision_aware_optimizer`` with float32 state dtypes (the adapter keeps float32 master weights and
    moments, the numbers that option gives). Any other option is refused there.

    Args:
        overrides: the dictionary (null counts as empty).
        key: its full key (``actor_rollout_ref.actor.optim.override_optimizer_config``).
        uses_megatron_optimizer: whether megatron-core's optimizer runs (False: the torch.optim adapter; None: not
            known yet, keys checked only).
        device_type: "cpu" or "cuda" (None: not known yet).

    Returns:
        The dictionary as a plain dict.

    Raises:
        ValueError: an unknown or otherwise-decided key (as :func:`check_passthrough_keys`); on the adapter, an
            option it does not already satisfy.
    """
    checked = check_passthrough_keys(overrides, "optimizer", key, OPTIMIZER_FIELDS_FROM_KEYS)
    if not checked or uses_megatron_optimizer is not False:
        return checked
    held = set()
    if device_type == "cpu":
        held |= HOST_MEMORY_OPTIMIZER_OPTIONS & set(checked)
    if "use_precision_aware_optimizer" in checked and all(
        str(checked.get(name, "float32")).removeprefix("torch.") in ("float32", "fp32")
        for name in PRECISION_AWARE_DTYPES
    ):
        held.add("use_precision_aware_optimizer")
    unmet = sorted(set(checked) - held)
    if unmet:
        raise ValueError(
            f"{key} sets {unmet}: megatron-core's OptimizerConfig options, and this model trains on the "
            "torch.optim adapter (CPU, or megatron.use_megatron_optimizer=false), which has no such options. Leave "
            "them out, or train on megatron-core's path (CUDA)."
        )
    logger.info(
        "%s: %s already hold on the torch.optim adapter (float32 optimizer state in host memory)",
        key,
        ", ".join(f"{name}={checked[name]}" for name in sorted(held)),
    )
    return checked


def check_megatron_sections(config: Any) -> None:
    """The cross-section rules of the megatron keys, for :class:`~verl.workers.config.PPOConfig`.

    The reference shares the actor's process and so megatron-core's model-parallel groups: its layout must be the
    actor's. ``optim.override_optimizer_config`` applies to megatron-core's optimizer only. On ``trainer.device=cpu``
    what needs CUDA is refused here (:meth:`MegatronConfig.check_device`); on CUDA the builders check again.

    Args:
        config: the whole :class:`~verl.workers.config.PPOConfig`.

    Raises:
        ValueError: a rule broken, naming the key.
    """
    arr = config.actor_rollout_ref
    device = config.trainer.device if config.trainer.device == "cpu" else None
    sections = []  # (megatron section, its key, optim section or None, trainable, has an optimizer path)
    if arr.actor.strategy == "megatron":
        sections.append((arr.actor.megatron, "actor_rollout_ref.actor", arr.actor.optim, True, True))
        if config.needs_reference:
            sections.append((arr.ref.megatron, "actor_rollout_ref.ref", None, False, True))
            if not arr.ref.megatron.same_layout(arr.actor.megatron):
                raise ValueError(
                    "actor_rollout_ref.ref.megatron's tensor/pipeline/context parallel sizes differ from the actor's: "
                    "the reference runs in the actor's processes, which hold one set of megatron-core groups. Leave "
                    "the ref sizes at their defaults (they follow the actor's) or set them equal."
                )
    else:
        _refuse_optimizer_overrides(arr.actor.optim, "actor_rollout_ref.actor", arr.actor.strategy)
    if config.needs_critic:
        if config.critic_strategy == "megatron":
            sections.append((config.critic.megatron, "critic", config.critic.optim, True, False))
        else:
            _refuse_optimizer_overrides(config.critic.optim, "critic", config.critic_strategy)
    if sections and not megatron_core_installed():
        raise ValueError(
            f"{sections[0][1]}.strategy=megatron needs megatron-core, which is not installed: pip install "
            "'megatron-core>=0.16,<0.17' (or choose strategy=fsdp2 / dp)."
        )
    for megatron, key, optim, trainable, has_path in sections:
        megatron.check_passthroughs(f"{key}.megatron")
        role = config.critic if key == "critic" else arr.actor
        _check_engine_keys(megatron, key, role.dtype, f"{role.KEY}.dtype")
        uses_megatron = None
        if device is not None:
            megatron.check_device(device, f"{key}.megatron", trainable=trainable)
            uses_megatron = megatron.training_path(device, f"{key}.megatron", has_megatron_optimizer_path=has_path)
        elif not trainable:
            megatron.check_device("cuda", f"{key}.megatron", trainable=False)
        if optim is not None:
            check_optimizer_overrides(
                optim.override_optimizer_config,
                f"{key}.optim.override_optimizer_config",
                uses_megatron_optimizer=False if not has_path else uses_megatron,
                device_type=device,
            )


def _check_engine_keys(megatron: MegatronConfig, key: str, dtype: str, dtype_key: str) -> None:
    """verl's engine keys of a megatron section: ``dtype`` where the role did not take it in (the reference, which
    computes in the actor's dtype; a critic whose strategy follows the actor's): null or the role's dtype;
    ``use_remove_padding`` (logged: what runs here)."""
    if megatron.dtype is not None and megatron.dtype != dtype:
        raise ValueError(
            f"{key}.megatron.dtype={megatron.dtype} differs from {dtype_key}={dtype}, the dtype this model computes "
            f"in. Leave it null, or set {dtype_key}."
        )
    if megatron.use_remove_padding:
        logger.info("%s.megatron.use_remove_padding=true: %s", key, REMOVE_PADDING_NOTE)


def _refuse_optimizer_overrides(optim: Any, key: str, strategy: str) -> None:
    if optim.override_optimizer_config:
        raise ValueError(
            f"{key}.optim.override_optimizer_config is set, but nothing reads it: it holds megatron-core "
            f"OptimizerConfig fields, which apply with {key}.strategy=megatron (it trains with {strategy}). Leave it "
            "empty."
        )
