"""Precision of an FSDP2 model beyond its compute dtype: verl's ``fsdp_config.model_dtype`` and ``mixed_precision``.

Four dtypes describe an ``fsdp2`` model (strategy ``fsdp`` / ``fsdp2``); :func:`fsdp_precision` works them out from a
role's ``dtype`` and its ``fsdp_config`` and refuses the combinations that contradict this project's precision
contract:

- **compute** (the role's ``dtype``; the reference follows the actor's): the forward and backward run under
  ``torch.autocast`` in it, and ``float16`` turns on the dynamic loss scale of ``optim`` (docs/advance/fp16.md).
  It plays the part of verl's ``fsdp_config.dtype``, the dtype of verl's own autocast.
- **model** (``model_dtype``): the dtype the weights are loaded in and the FSDP2 shards are kept in, i.e. the master
  copy the optimizer updates (and the dtype of AdamW's moments, which follow the parameters). The YAML default is
  ``fp32`` for every role, as verl's; null takes what verl's code takes when the key is absent: ``float32`` for a
  trained model, ``bfloat16`` for the frozen (forward-only) reference. ``bf16`` on a trained model keeps the master
  copy in bf16 whatever the compute dtype: the forward and backward still compute in ``dtype`` (FSDP2 gathers the
  weights in it, and an fp16 run keeps its dynamic loss scale), and updates smaller than bf16's resolution are
  rounded away, as in verl; the worker logs that when the compute dtype is not bf16.
- **param** (``mixed_precision.param_dtype``): the dtype FSDP2 gathers the weights in before each unit's forward
  (``MixedPrecisionPolicy.param_dtype``). null: the compute dtype (what verl does without a ``mixed_precision``
  section). As in verl, where the actor's autocast dtype and ``mixed_precision.param_dtype`` are separate settings,
  the two are not the same key: with ``param_dtype=bf16`` and ``dtype=float16`` (verl's
  ``run_qwen3-32b_npu.sh`` on this project's fp16 default) the weights are gathered in bf16 and the layers compute
  in fp16 under autocast, i.e. on bf16-rounded weights. The combination is accepted, and the worker logs that the
  trainer then sees weights an fp16 rollout engine does not (``training/rollout_probs_diff_*`` shows the gap).
- **reduce** (``mixed_precision.reduce_dtype``): the dtype of the gradients' reduce-scatter. null: ``float32``.
- **buffer** (``mixed_precision.buffer_dtype``): the dtype of the model's floating-point buffers (the rotary
  frequencies), which FSDP2 does not shard; they are cast once before sharding (verl's FSDP1 meaning; its FSDP2
  path ignores the key). null: ``float32``.

Refused, with the key, the reason and what to set:

- a trained model (actor, critic) kept in fp16 (``model_dtype=fp16``): AdamW's moments would be fp16 too, and the
  second moment (a gradient squared) underflows to zero in fp16's range, which turns the update into the first
  moment divided by ``eps``; updates below fp16's resolution would be lost besides. It cannot train;
- gathering in fp16, or reducing gradients in fp16, for a trained model that does not compute in fp16: those fp16
  gradients would have no loss scale to keep them from underflowing;
- gathering in 16 bits for a trained model with ``dtype=float32``: FSDP2 then computes in that dtype (it casts the
  inputs to it), which is not the fp32 run the config asks for;
- ``reduce_dtype`` on the frozen reference, which computes no gradients (leave it null).

verl's spellings are accepted everywhere: ``fp32``/``float32``, ``bf16``/``bfloat16``, ``fp16``/``float16``.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar, Literal

from verl.workers.config.schema import BaseConfig

# one backend, two names: fsdp is what verl's scripts say. Defined here, below roles.py, because both the role
# sections and the FSDP precision check need it; roles.py re-exports it.
FSDP_STRATEGIES = ("fsdp", "fsdp2")
# verl's spellings of a precision (its PrecisionType names)
VerlDType = Literal["fp32", "float32", "bf16", "bfloat16", "fp16", "float16"]
VERL_DTYPES = typing.get_args(VerlDType)
_CANONICAL = {
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
}
_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def canonical_dtype(name: str | None, default: str) -> str:
    """This project's name (``float32`` | ``bfloat16`` | ``float16``) of a verl spelling; ``default`` for null."""
    return default if name is None else _CANONICAL[name]


@dataclasses.dataclass(frozen=True)
class MixedPrecisionConfig(BaseConfig):
    """``<role>.fsdp_config.mixed_precision``: verl's FSDP mixed-precision section (each entry null = its default).

    ``param_dtype``: the dtype the weights are gathered in (null: the role's compute ``dtype``); ``reduce_dtype``:
    of the gradient reduce-scatter (null: fp32); ``buffer_dtype``: of the floating-point buffers (null: fp32). A
    null section stands for all three null. See :mod:`verl.workers.config.precision` for the relation to ``dtype``
    and ``model_dtype``.
    """

    param_dtype: VerlDType | None
    reduce_dtype: VerlDType | None
    buffer_dtype: VerlDType | None

    @classmethod
    def from_shorthand(cls, value: Any, key: str) -> Any:
        if value is None:  # verl's own default is a null section
            return {"param_dtype": None, "reduce_dtype": None, "buffer_dtype": None}
        return value


@dataclasses.dataclass(frozen=True)
class FSDPPrecision:
    """The dtypes of one FSDP2 model, in this project's names (``float32`` | ``bfloat16`` | ``float16``).

    Attributes:
        compute: autocast dtype of the forward and backward (the role's ``dtype``).
        model: dtype of the loaded weights and of the shards (the master copy of a trained model).
        param: dtype the weights are gathered in for compute.
        reduce: dtype of the gradient reduce-scatter.
        buffer: dtype of the floating-point buffers.
    """

    DEFAULT_MODEL: ClassVar[str] = "float32"
    DEFAULT_FROZEN_MODEL: ClassVar[str] = "bfloat16"

    compute: str
    model: str
    param: str
    reduce: str
    buffer: str

    @property
    def master_coarser_than_compute(self) -> bool:
        """Whether a trained model keeps bf16 master weights while it computes in another dtype (verl's
        ``model_dtype=bf16`` on an fp16 or fp32 run): updates below bf16's resolution are rounded away."""
        return self.model == "bfloat16" and self.compute != "bfloat16"

    @property
    def gathers_coarser_than_compute(self) -> bool:
        """Whether the weights are rounded to bf16 before an fp16 compute (bf16 keeps fewer mantissa bits)."""
        return self.param == "bfloat16" and self.compute == "float16"


def model_dtype_of(fsdp_config: Any, *, trainable: bool = True) -> str:
    """The dtype an FSDP2 model is loaded in: its ``fsdp_config.model_dtype``; null as verl's code reads an absent
    key: ``float32`` for a trained model, ``bfloat16`` for the frozen reference."""
    default = FSDPPrecision.DEFAULT_MODEL if trainable else FSDPPrecision.DEFAULT_FROZEN_MODEL
    return canonical_dtype(fsdp_config.model_dtype, default)


def fsdp_precision(
    compute_dtype: str, fsdp_config: Any, *, trainable: bool, key: str, dtype_key: str = "dtype"
) -> FSDPPrecision:
    """The dtypes of an FSDP2 model from its role's ``dtype`` and its ``fsdp_config``, or a refusal.

    Args:
        compute_dtype: the role's ``dtype`` (the reference: the actor's).
        fsdp_config: the model's ``fsdp_config`` section (``model_dtype``, ``mixed_precision``).
        trainable: whether an optimizer updates the model (actor, critic) or it is the frozen reference.
        key: the section's full key (``actor_rollout_ref.actor.fsdp_config``), for messages.
        dtype_key: the full key of the compute dtype (``actor_rollout_ref.actor.dtype``), for messages.

    Raises:
        ValueError: a combination that contradicts the precision contract (see the module's docstring); the message
            names the key, says why, and what to set.
    """
    mixed = fsdp_config.mixed_precision
    precision = FSDPPrecision(
        compute=compute_dtype,
        model=model_dtype_of(fsdp_config, trainable=trainable),
        param=canonical_dtype(mixed.param_dtype, compute_dtype),
        reduce=canonical_dtype(mixed.reduce_dtype, "float32"),
        buffer=canonical_dtype(mixed.buffer_dtype, "float32"),
    )
    if trainable:
        _check_trained(precision, fsdp_config, key, dtype_key)
    elif mixed.reduce_dtype is not None:
        raise ValueError(
            f"{key}.mixed_precision.reduce_dtype={mixed.reduce_dtype}: the frozen reference computes no gradients, so "
            "nothing would be reduced in it; leave it null."
        )
    return precision


def _check_trained(p: FSDPPrecision, fsdp_config: Any, key: str, dtype_key: str) -> None:
    compute = f"{dtype_key}={p.compute}"
    model = f"{key}.model_dtype={fsdp_config.model_dtype}"
    if p.model == "float16":
        raise ValueError(
            f"{model} would keep the weights the optimizer updates (the master copy), and with them AdamW's moments, "
            f"in fp16 ({compute}): the second moment, a gradient squared, underflows to zero in fp16, which turns "
            "each update into the first moment divided by AdamW's eps, and updates below fp16's resolution would be "
            f"lost. It cannot train. Set {key}.model_dtype=fp32 (the master copy of an fp16 run), or bf16 to hold "
            "the weights in half the memory (fp32's range, coarser updates)."
        )
    mixed = fsdp_config.mixed_precision
    for field, value in (("param_dtype", p.param), ("reduce_dtype", p.reduce)):
        if value == "float16" and p.compute != "float16":
            fix = _SHORT[p.compute] if field == "param_dtype" else "fp32"
            raise ValueError(
                f"{key}.mixed_precision.{field}={getattr(mixed, field)} with {compute}: the gradients would pass "
                f"through fp16 without the dynamic loss scale that only {dtype_key}=float16 runs, and small ones "
                f"would underflow to zero. Set {key}.mixed_precision.{field}={fix} (or null), or train in fp16 with "
                f"{dtype_key}=float16."
            )
    if p.compute == "float32" and p.param != "float32":
        raise ValueError(
            f"{key}.mixed_precision.param_dtype={mixed.param_dtype} with {compute}: FSDP2 would gather the weights "
            f"in {p.param} and cast the inputs to it, so the model would compute in {p.param}, not in the fp32 the "
            f"run asks for. Set {dtype_key}={p.param} to compute in {p.param} (under autocast, as verl does), or "
            f"{key}.mixed_precision.param_dtype=fp32 (or null)."
        )


FSDP_SIZE_REASON = (
    "hybrid sharding (HSDP: shards within groups of fsdp_size ranks, replicas across the groups), which is not built "
    "here: every FSDP2 model is sharded over all ranks"
)


def check_fsdp_size(fsdp_config: Any, world_size: int, key: str) -> None:
    """verl's ``fsdp_size``: -1 (verl's default: every rank) or the world size, which mean the same; any other size
    asks for hybrid sharding, refused with :data:`FSDP_SIZE_REASON`.

    Raises:
        ValueError: naming ``key`` (the section's full key).
    """
    size = fsdp_config.fsdp_size
    if size not in (-1, world_size):
        raise ValueError(
            f"{key}.fsdp_size={size} with {world_size} rank(s) asks for {FSDP_SIZE_REASON}. Set it to -1 (or "
            f"{world_size})."
        )


def check_fsdp_precision(config: Any) -> None:
    """Start-up check of every FSDP2 model the run builds (actor; reference when it has its own copy; critic when it
    trains): :func:`fsdp_precision` and :func:`check_fsdp_size` for each, so a contradiction stops the run before
    Ray starts.

    Args:
        config: the :class:`~verl.workers.config.PPOConfig`.
    """
    arr, critic = config.actor_rollout_ref, config.critic
    actor_dtype = f"{arr.actor.KEY}.dtype"
    models = []  # (compute dtype, its key, fsdp section, its key, trainable)
    if arr.actor.strategy in FSDP_STRATEGIES:
        models.append((arr.actor.dtype, actor_dtype, arr.actor.fsdp_config, f"{arr.actor.KEY}.fsdp_config", True))
        if config.needs_reference:
            models.append((arr.actor.dtype, actor_dtype, arr.ref.fsdp_config, f"{arr.ref.KEY}.fsdp_config", False))
    if config.needs_critic and config.critic_strategy in FSDP_STRATEGIES:
        fsdp_key = f"{critic.KEY}.model.fsdp_config"
        models.append((critic.dtype, f"{critic.KEY}.dtype", critic.model.fsdp_config, fsdp_key, True))
    for dtype, dtype_key, fsdp_config, key, trainable in models:
        fsdp_precision(dtype, fsdp_config, trainable=trainable, key=key, dtype_key=dtype_key)
        check_fsdp_size(fsdp_config, config.world_size, key)
