"""The one update loop every trained model runs, and its optimizer-step contract.

:class:`UpdateLoop` is role-neutral: ``ppo_epochs`` x mini-batches x micro-batches, gradient accumulation weighted
by each micro-batch's share, one optimizer step per mini-batch, and then always
``outcome = self._optimizer_step()`` followed by ``self.update_outcome_handler.handle(outcome)``. The loop never
branches on success itself, so what a failed update means is decided by the configured policy alone. The actor
(:class:`~verl.workers.actor.base.BasePPOActor`) and the critic (:class:`~verl.workers.critic.base.BasePPOCritic`)
are siblings on this loop: each says which batch keys its update reads and what the loss of a micro-batch is. A
backend says how its model runs (:meth:`UpdateLoop.model_module`, and optionally the backward schedule).

The builders construct the update-outcome handler and the fire drill and pass them in; a frozen model (the
reference policy) gets neither, and no optimizer.
"""

from __future__ import annotations

import contextlib
import logging
import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch

from verl.protocol import DataProto
from verl.utils.checkpoint import load_state, load_weights, save_state, save_weights
from verl.utils.metrics import StepMetrics
from verl.utils.micro_batching import split_by_length
from verl.workers.actor.fault_injection import FaultInjector
from verl.workers.config import TrainedModelConfig
from verl.workers.update_outcome import UpdateOutcome, UpdateOutcomeHandler

logger = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _tied_aliases(weights: dict[str, torch.Tensor]) -> set[str]:
    # Tied output weights are saved once under the embedding name by some models; nothing is missing then.
    return {"lm_head.weight"} if "model.embed_tokens.weight" in weights else set()


class UpdateLoop(ABC):
    """Mini-batch training under the optimizer-step contract, for any role.

    Args:
        config: the model's section (``actor_rollout_ref.actor`` or ``critic``) with ``ppo_mini_batch_size`` in
            samples per rank (see :meth:`~verl.workers.config.TrainedModelConfig.per_rank`).
        optimizer: an optimizer with megatron-core's contract: ``step() -> (successful, grad_norm, num_zeros)``,
            ``get_loss_scale()``, ``zero_grad()``, ``backward(loss)``, ``state_dict()``; None for a frozen model.
        lr_scheduler: stepped once per training step in which at least one update succeeded.
        update_outcome_handler: decides what a failed update means (None for a frozen model).
        fault_injector: the fire drill (None: off).
        rank: data-parallel rank.

    The role ("actor" or "critic") comes from the config's class: it prefixes metrics and is reported in every
    outcome.
    """

    # Where the fire drill strikes: False poisons the gradients before the optimizer step (the optimizer reduces
    # them itself); a backend whose gradients are reduced inside its backward schedule poisons the losses instead.
    fire_drill_poisons_loss = False

    def __init__(
        self,
        config: TrainedModelConfig,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        *,
        update_outcome_handler: UpdateOutcomeHandler | None = None,
        fault_injector: FaultInjector | None = None,
        rank: int = 0,
    ):
        self.config = config
        self.role = type(config).ROLE
        if optimizer is not None and update_outcome_handler is None:
            raise ValueError(f"{self.role}: a trained model needs an update-outcome handler (see build_loop_parts).")
        self.rank = rank
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.update_outcome_handler = update_outcome_handler
        self.fault_injector = fault_injector if fault_injector is not None else FaultInjector(rank=rank)
        self.dtype = TORCH_DTYPES[config.dtype]
        self.num_update_steps = 0
        self.mini_batch_size = config.ppo_mini_batch_size
        self.micro_batch_size = config.ppo_micro_batch_size_per_gpu
        self.micro_batching = config.train_micro_batching()
        if not config.use_dynamic_bsz and self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"{type(config).KEY}: the per-rank mini-batch ({self.mini_batch_size} samples) must be a multiple of "
                f"ppo_micro_batch_size_per_gpu ({self.micro_batch_size})."
            )

    # ------------------------------------------------------------------ what a backend provides

    @abstractmethod
    def model_module(self) -> torch.nn.Module:
        """The trained module (unwrapped), whose state_dict is the checkpointed weights."""

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates (the fire drill poisons their gradients)."""
        return [p for p in self.model_module().parameters() if p.requires_grad]

    def autocast(self):
        """Mixed-precision context for forward passes (fp32 master weights, fp16/bf16 compute)."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        device = next(self.model_module().parameters()).device.type
        return torch.autocast(device_type=device, dtype=self.dtype)

    def _current_loss_scale(self) -> float | None:
        scale = self.optimizer.get_loss_scale()
        return None if scale is None else float(scale)

    def _min_loss_scale(self) -> float | None:
        return getattr(self.optimizer, "min_loss_scale", None)

    # ------------------------------------------------------------------ what a role provides

    @abstractmethod
    def _update_batch_keys(self, data: DataProto) -> list[str]:
        """The batch keys one update reads (``data`` may tell which optional keys are present)."""

    @abstractmethod
    def _micro_batch_loss(self, micro: DataProto, temperature: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one micro-batch (with gradients) and its metrics (reduced by mean over a step)."""

    # ------------------------------------------------------------------ the loop

    def _micro_batch_weight(self, micro: DataProto, mini: DataProto) -> float:
        """The micro-batch's share of the mini-batch, so that accumulated gradients equal the mini-batch loss's.

        token-mean averages over tokens, so the share is by valid tokens; the sequence-mean modes share by rows.
        """
        if self.config.loss_agg_mode == "token-mean":
            return float(micro.batch["response_mask"].sum()) / max(float(mini.batch["response_mask"].sum()), 1.0)
        return len(micro) / len(mini)

    def _backward_mini_batch(self, mini: DataProto, temperature: float) -> list[dict[str, float]]:
        """Forward and backward every micro-batch of ``mini``, accumulating gradients; returns their metrics."""
        self.optimizer.zero_grad()
        all_metrics = []
        micro_batches, _ = split_by_length(mini, self.micro_batching)  # similar lengths: little padding each
        for micro in micro_batches:
            loss, metrics = self._micro_batch_loss(micro, temperature)
            self.optimizer.backward(loss * self._micro_batch_weight(micro, mini))
            all_metrics.append(metrics)
        return all_metrics

    def _optimizer_step(self) -> UpdateOutcome:
        """One optimizer step, reported as an :class:`UpdateOutcome` (computed from globally reduced values)."""
        self.num_update_steps += 1
        step = self.num_update_steps
        if not self.fire_drill_poisons_loss:
            self.fault_injector.maybe_poison(step, self.trainable_parameters())
        loss_scale = self._current_loss_scale()  # the scale this step's gradients were computed with
        successful, grad_norm, num_zeros = self._step_optimizer()
        return UpdateOutcome(
            successful=bool(successful),
            grad_norm=None if grad_norm is None else float(grad_norm),
            num_zeros_in_grad=None if num_zeros is None else int(num_zeros),
            loss_scale=loss_scale,
            min_loss_scale=self._min_loss_scale(),
            step=step,
            role=self.role,
        )

    def _step_optimizer(self) -> tuple[bool, float | None, int | None]:
        """The optimizer's ``step()``; a backend may guard it (see MegatronPPOActor)."""
        return self.optimizer.step()

    def update(self, data: DataProto) -> dict[str, float]:
        """Train on ``data`` (rows of this rank) and return the step's metrics, reduced over its updates.

        Raises:
            UpdateFailedError: when the update-failure policy stops the run.
            ValueError: a frozen model, or a batch that does not split into mini-batches.
        """
        if self.optimizer is None:
            raise ValueError(f"{self.role}: this model is frozen (built without an optimizer); it cannot train.")
        temperature = data.meta_info.get("temperature", 1.0)
        data = data.select(batch_keys=self._update_batch_keys(data))
        if len(data) % self.mini_batch_size:
            raise ValueError(
                f"{self.role}: {len(data)} samples on this rank do not split into mini-batches of "
                f"{self.mini_batch_size}; make the batch a multiple of the mini-batch size."
            )
        seed = self.config.seed + self.num_update_steps if self.config.shuffle else None
        metrics = StepMetrics()
        handler_reductions = {
            f"{self.role}/{name}": how for name, how in self.update_outcome_handler.metric_reductions().items()
        }
        num_successful = 0
        for mini in data.make_iterator(self.mini_batch_size, self.config.ppo_epochs, seed=seed):
            for micro_metrics in self._backward_mini_batch(mini, temperature):
                metrics.add(micro_metrics)
            outcome = self._optimizer_step()
            metrics.add(self.update_outcome_handler.handle(outcome), handler_reductions)
            if outcome.successful:
                num_successful += 1
                metrics.add({f"{self.role}/grad_norm": outcome.grad_norm})
        if num_successful and self.lr_scheduler is not None:
            self.lr_scheduler.step()  # a step in which no update succeeded does not advance the schedule
        reduced = metrics.reduce()
        reduced[f"{self.role}/num_updates_successful"] = float(num_successful)
        reduced[f"{self.role}/num_updates_attempted"] = float(self.num_update_steps)
        reduced[f"{self.role}/lr"] = float(self.optimizer.param_groups[0]["lr"])
        return reduced

    # ------------------------------------------------------------------ checkpoint state

    def training_state_dict(self) -> dict[str, Any]:
        """Everything but the weights: optimizer (with loss scaler), LR schedule, handler, step counter."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.state_dict(),
            "update_outcome_handler": self.update_outcome_handler.state_dict(),
            "num_update_steps": self.num_update_steps,
        }

    def load_training_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.update_outcome_handler.load_state_dict(state["update_outcome_handler"])
        self.num_update_steps = int(state["num_update_steps"])

    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        """Weights to ``model.safetensors`` and the training state to ``train_state.pt`` in ``directory``.

        The caller makes the directory atomic (see :func:`verl.utils.checkpoint.atomic_directory`).
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_weights(directory / "model.safetensors", self.model_module().state_dict())
        save_state(directory / "train_state.pt", self.training_state_dict())

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Restore what :meth:`save_checkpoint` wrote: weights, optimizer, loss scaler, LR schedule, handler."""
        directory = Path(directory)
        weights = load_weights(directory / "model.safetensors")
        missing, unexpected = self.model_module().load_state_dict(weights, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state") and k not in _tied_aliases(weights)]
        if missing or unexpected:
            raise ValueError(
                f"{directory}: checkpoint weights do not fit the model (missing {missing[:5]}, unexpected "
                f"{list(unexpected)[:5]}); was it written for another model?"
            )
        self.load_training_state_dict(load_state(directory / "train_state.pt"))


def build_loop_parts(config: TrainedModelConfig, *, rank: int) -> dict[str, Any]:
    """The update-outcome handler and the fire drill of a trained model, as keyword arguments of the loop."""
    from verl.workers.update_outcome import build_update_outcome_handler

    return {
        "update_outcome_handler": build_update_outcome_handler(
            config.update_failure_policy, dtype=config.dtype, role=type(config).ROLE
        ),
        "fault_injector": FaultInjector.from_config(config.fault_injection, rank=rank),
        "rank": rank,
    }
