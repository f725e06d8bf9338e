"""verl's critic config classes (``verl.workers.config.critic``) over this package's ``critic`` section.

``CriticConfig(strategy="fsdp2", ppo_micro_batch_size_per_gpu=2, optim=OptimizerConfig(lr=1e-5))`` is ``critic``
of the YAML with those keys changed (:mod:`verl.workers.config.verl_named`). Like verl's, it also keeps
``rollout_n`` (default: ``actor_rollout_ref.rollout.n``) and verl's older global ``ppo_micro_batch_size`` and
``forward_micro_batch_size`` (default None), with verl's start-up rules on the micro-batch sizes. Batch sizes stay
assignable, as in verl; the rest is fixed.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from verl.workers.config import roles
from verl.workers.config.actor import check_micro_batch_sizes, check_sizes_against_run
from verl.workers.config.verl_named import VerlNamedConfig, verl_named

__all__ = ["CriticConfig", "FSDPCriticConfig", "McoreCriticConfig"]


@verl_named(
    extras={"rollout_n": "actor_rollout_ref.rollout.n", "ppo_micro_batch_size": None, "forward_micro_batch_size": None},
    mutable=(
        "ppo_mini_batch_size",
        "ppo_micro_batch_size",
        "ppo_micro_batch_size_per_gpu",
        "forward_micro_batch_size",
        "forward_micro_batch_size_per_gpu",
    ),
)
class CriticConfig(roles.CriticConfig, VerlNamedConfig):
    """``critic`` under verl's name."""

    rollout_n: typing.ClassVar[int]  # set per instance (verl attributes, not keys of the section)
    ppo_micro_batch_size: typing.ClassVar[int | None]
    forward_micro_batch_size: typing.ClassVar[int | None]

    @classmethod
    def verl_check(cls, values: dict[str, Any], extras: dict[str, Any]) -> None:
        check_micro_batch_sizes("critic", values, extras)
        micro = extras["ppo_micro_batch_size"]
        if not values["use_dynamic_bsz"] and micro is not None and values["ppo_mini_batch_size"] % micro != 0:
            raise ValueError(
                f"[critic] ppo_mini_batch_size ({values['ppo_mini_batch_size']}) must be divisible by "
                f"ppo_micro_batch_size ({micro})."
            )

    def validate(self, n_gpus: int, train_batch_size: int) -> None:
        """verl's run-time checks: the batch sizes against ``n_gpus`` and ``train_batch_size``.

        Raises:
            ValueError: as verl's ``CriticConfig.validate``.
        """
        check_sizes_against_run(self, "critic", n_gpus, train_batch_size)


@verl_named(fixed={"strategy": "fsdp"})
class FSDPCriticConfig(CriticConfig):
    """The critic of the FSDP backends (``strategy`` fsdp unless given)."""

    @classmethod
    def verl_check(cls, values: dict[str, Any], extras: dict[str, Any]) -> None:
        super().verl_check(values, extras)
        model = values["model"]
        padding_free = model.get("use_remove_padding") if isinstance(model, Mapping) else model.use_remove_padding
        if values["ulysses_sequence_parallel_size"] > 1 and not padding_free:
            raise ValueError(
                "When using sequence parallelism for critic, you must enable `use_remove_padding` (critic.model)."
            )


@verl_named(defaults_from="ppo_megatron_trainer", fixed={"strategy": "megatron"})
class McoreCriticConfig(CriticConfig):
    """The critic of the megatron backend; the defaults of ``ppo_megatron_trainer.yaml``."""
