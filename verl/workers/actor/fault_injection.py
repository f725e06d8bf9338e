"""The fire drill: make chosen update steps produce non-finite gradients, on all ranks or on chosen ones.

Before a long run a user wants to see their update-failure policy act: skip, warn, count, stop. Setting
``fault_injection.nonfinite_grad_steps: [3, 4]`` poisons the gradients of update steps 3 and 4 (1-based, counted
like ``UpdateOutcome.step``) before the gradient all-reduce, which then carries the NaN to every rank, as a real
overflow on one rank would. Where the optimizer reduces the gradients itself (the ``dp`` backend and the megatron
CPU path: :class:`~verl.utils.amp_optimizer.AmpOptimizer`) the gradients are poisoned right before its step. On the
megatron GPU path megatron-core's DDP reduces them inside the forward/backward schedule, so there the drill poisons
the micro-batch losses instead (:meth:`FaultInjector.poison_loss`): the backward then produces the NaN gradients.
Which of the two a model gets is declared by its backend (``fire_drill_target``, a
:class:`~verl.workers.actor.backend.FireDrillTarget`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from verl.workers.config import FaultInjectionConfig


logger = logging.getLogger(__name__)


class FaultInjector:
    """Poisons gradients at chosen update steps.

    Args:
        nonfinite_grad_steps: 1-based update steps whose gradients become NaN (empty: off).
        ranks: the data-parallel ranks that poison their gradients; None means every rank.
        rank: this process's data-parallel rank.

    The values are checked where the config is built (:class:`~verl.workers.config.FaultInjectionConfig`).
    """

    def __init__(self, nonfinite_grad_steps: Iterable[int] = (), ranks: Iterable[int] | None = None, rank: int = 0):
        self.steps = set(nonfinite_grad_steps)
        self.ranks = None if ranks is None else list(ranks)
        self.rank = rank
        self._last_poisoned_loss_step: int | None = None
        if self.steps and self.applies_to_rank():
            logger.warning(
                "Fire drill on: update steps %s get non-finite gradients on rank %d.", sorted(self.steps), rank
            )

    @classmethod
    def from_config(cls, config: FaultInjectionConfig, rank: int) -> FaultInjector:
        """The drill of a validated ``fault_injection`` section (:class:`~verl.workers.config.FaultInjectionConfig`)."""
        return cls(config.nonfinite_grad_steps, config.ranks, rank=rank)

    def applies_to_rank(self) -> bool:
        return self.ranks is None or self.rank in self.ranks

    def applies_to(self, step: int) -> bool:
        return step in self.steps and self.applies_to_rank()

    @torch.no_grad()
    def maybe_poison(self, step: int, params: Iterable[torch.nn.Parameter]) -> bool:
        """Fill one gradient with NaN when ``step`` is a drill step for this rank; returns whether it did.

        megatron-core's DDP keeps gradients in ``param.main_grad``; plain PyTorch in ``param.grad``.
        """
        if not self.applies_to(step):
            return False
        for param in params:
            grad = getattr(param, "main_grad", None)
            if grad is None:
                grad = param.grad
            if grad is not None:
                grad.fill_(float("nan"))
                logger.warning("Fire drill: poisoned the gradients of update step %d on rank %d.", step, self.rank)
                return True
        return False

    def poison_loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times NaN when ``step`` is a drill step for this rank (its backward gives NaN gradients)."""
        if not self.applies_to(step):
            return loss
        if step != self._last_poisoned_loss_step:
            self._last_poisoned_loss_step = step
            logger.warning("Fire drill: poisoned the losses of update step %d on rank %d.", step, self.rank)
        return loss * float("nan")
