"""verl's actor config classes (``verl.workers.config.actor``) over this package's actor section.

``ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=4, optim=OptimizerConfig(lr=1e-6), rollout_n=8)``
is ``actor_rollout_ref.actor`` of the YAML with those keys changed (:mod:`verl.workers.config.verl_named`).
Besides the section's keys it keeps verl's ``rollout_n`` (default: ``actor_rollout_ref.rollout.n``) and verl's
older global ``ppo_micro_batch_size`` (default None), and applies verl's start-up rules to them with verl's
messages: one of the two micro-batch sizes unless ``use_dynamic_bsz``, never both. :meth:`ActorConfig.validate`
checks the sizes against the GPU count and the train batch size, as verl's does. Batch sizes stay assignable, as in
verl; the rest is fixed.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from verl.workers.config import roles
from verl.workers.config.verl_named import VerlNamedConfig, verl_named

__all__ = ["ActorConfig", "FSDPActorConfig", "McoreActorConfig", "check_micro_batch_sizes"]

_BATCH_SIZES = ("ppo_mini_batch_size", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu")


def check_micro_batch_sizes(role: str, values: Mapping[str, Any], extras: Mapping[str, Any]) -> None:
    """verl's rule: without dynamic batch sizes, exactly one of the global and per-GPU micro-batch sizes."""
    if values["use_dynamic_bsz"]:
        return
    per_gpu, total = values["ppo_micro_batch_size_per_gpu"], extras["ppo_micro_batch_size"]
    if per_gpu is not None and total is not None:
        raise ValueError(
            f"[{role}] You have set both '{role}.ppo_micro_batch_size' AND '{role}.ppo_micro_batch_size_per_gpu'; "
            "keep only the per-GPU size (the global one is verl's older spelling)."
        )
    if per_gpu is None and total is None:
        raise ValueError(
            f"[{role}] Please set at least one of '{role}.ppo_micro_batch_size' or "
            f"'{role}.ppo_micro_batch_size_per_gpu' (or use_dynamic_bsz=true)."
        )


def check_sizes_against_run(config: Any, role: str, n_gpus: int, train_batch_size: int) -> None:
    """verl's run-time rules of the batch sizes: the mini-batch fits in the train batch; the global micro-batch
    divides the mini-batch and gives every GPU at least one sample."""
    if config.use_dynamic_bsz:
        return
    if train_batch_size < config.ppo_mini_batch_size:
        raise ValueError(
            f"train_batch_size ({train_batch_size}) must be >= {role}.ppo_mini_batch_size "
            f"({config.ppo_mini_batch_size})."
        )
    micro = config.ppo_micro_batch_size
    if micro is None:
        return
    if config.ppo_mini_batch_size % micro != 0:
        raise ValueError(
            f"ppo_mini_batch_size ({config.ppo_mini_batch_size}) must be divisible by ppo_micro_batch_size ({micro})."
        )
    if micro * config.ulysses_sequence_parallel_size < n_gpus:
        raise ValueError(
            f"ppo_micro_batch_size ({micro}) * ulysses_sequence_parallel_size "
            f"({config.ulysses_sequence_parallel_size}) must be >= n_gpus ({n_gpus})."
        )


@verl_named(
    extras={"rollout_n": "actor_rollout_ref.rollout.n", "ppo_micro_batch_size": None},
    mutable=_BATCH_SIZES,
)
class ActorConfig(roles.ActorConfig, VerlNamedConfig):
    """``actor_rollout_ref.actor`` under verl's name."""

    rollout_n: typing.ClassVar[int]  # set per instance (a verl attribute, not a key of the section)
    ppo_micro_batch_size: typing.ClassVar[int | None]

    @classmethod
    def verl_check(cls, values: dict[str, Any], extras: dict[str, Any]) -> None:
        accepted = typing.get_args(roles.LossAggMode)
        if values["loss_agg_mode"] not in accepted:
            raise ValueError(f"Invalid loss_agg_mode: {values['loss_agg_mode']!r}; use one of {list(accepted)}.")
        check_micro_batch_sizes("actor", values, extras)

    def validate(self, n_gpus: int, train_batch_size: int, model_config: Mapping[str, Any] | None = None) -> None:
        """verl's run-time checks: the batch sizes against ``n_gpus`` and ``train_batch_size``.

        Raises:
            ValueError: as verl's ``ActorConfig.validate``.
        """
        check_sizes_against_run(self, "actor", n_gpus, train_batch_size)


@verl_named(fixed={"strategy": "fsdp"})
class FSDPActorConfig(ActorConfig):
    """The actor of the FSDP backends (``strategy`` fsdp unless given: fsdp2, or dp for plain data parallel)."""

    def validate(self, n_gpus: int, train_batch_size: int, model_config: Mapping[str, Any] | None = None) -> None:
        super().validate(n_gpus, train_batch_size, model_config)
        if self.ulysses_sequence_parallel_size > 1 and model_config and not model_config.get("use_remove_padding"):
            raise ValueError(
                "When using sequence parallelism for actor/ref policy, you must enable `use_remove_padding`."
            )


@verl_named(defaults_from="ppo_megatron_trainer", fixed={"strategy": "megatron"})
class McoreActorConfig(ActorConfig):
    """The actor of the megatron backend; the defaults of ``ppo_megatron_trainer.yaml``."""
