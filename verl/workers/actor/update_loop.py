"""The one update loop every trained model runs, and its optimizer-step contract.

:class:`UpdateLoop` is role-neutral and backend-neutral: ``ppo_epochs`` x mini-batches x micro-batches, gradient
accumulation weighted by each micro-batch's share, one optimizer step per mini-batch, and then always
``outcome = self._optimizer_step()`` followed by ``self.update_outcome_handler.handle(outcome)``. The loop never
branches on success itself, so what a failed update means is decided by the configured policy alone; a training
step returns an :class:`~verl.workers.update_outcome.UpdateResult` (its outcomes, the run's counts, its metrics).
The actor (:class:`~verl.workers.actor.base.BasePPOActor`) and the critic
(:class:`~verl.workers.critic.base.BasePPOCritic`) are siblings on this loop: each says which batch keys its update
reads, at which temperature, and what the loss of a micro-batch is. Everything that differs between backends
(autocast, the backward over a mini-batch, where the fire drill poisons, the optimizer step and its loss scale,
checkpoints) is answered by the loop's :class:`~verl.workers.actor.backend.TrainingBackend`, which gets what it
trains with once (:class:`BackendParts`) and, per mini-batch, the mini-batch and its loss functions
(:class:`MiniBatchLoss`), never the loop itself; a model's class adds only its module and forward pass.

The builders construct the update-outcome handler and the fire drill and pass them in; a frozen model (the
reference policy) gets neither, and no optimizer.
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from typing import Any

import torch
import torch.distributed as dist

from verl.algorithms.core_algos import loss_share
from verl.protocol import DataProto
from verl.utils.metrics import StepMetrics
from verl.utils.profiler import mini_batch as profiled_mini_batch
from verl.workers.actor.backend import (
    PARTS_KEY,
    BackendParts,
    CheckpointContents,
    FireDrillTarget,
    MiniBatchLoss,
    TrainingBackend,
    check_checkpoint_parts,
)
from verl.workers.actor.fault_injection import FaultInjector
from verl.workers.config import TrainedModelConfig
from verl.workers.config.roles import TRAINING_STATE_PARTS
from verl.workers.update_outcome import FailureCause, UpdateOutcome, UpdateOutcomeHandler, UpdateResult

logger = logging.getLogger(__name__)
# what a resume without a part of the training state (checkpoint.load_contents) starts from
_FRESH = {
    "optimizer": "new optimizer moments and loss scale",
    "extra": "the LR schedule and the update counters from step 0",
}

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

#: Float batch keys that feed a loss (or, the rewards, what the advantages and returns come from), checked for inf/NaN
#: once per update; in the order a reader traces a NaN back: source first.
LOSS_INPUT_KEYS = (
    "token_level_rewards",
    "advantages",
    "returns",
    "values",
    "old_log_probs",
    "ref_log_prob",
    "rollout_log_probs",
    "rollout_is_weights",
)


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over every rank of the default process group (the ranks that train this model), so that
    all of them take the same decision; itself without one. One collective, on the device NCCL needs."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return tensor
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else tensor.device
    reduced = tensor.to(device)
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    return reduced.cpu()


def count_nonfinite_inputs(data: DataProto, keys: list[str]) -> torch.Tensor:
    """For each of ``keys``, the number of inf/NaN entries (tokens) of ``data``; a float (len(keys),) CPU tensor.

    Padding tokens count too: the losses mask by multiplying (``x * mask``), and ``NaN * 0`` is NaN, so a NaN on a
    padding token poisons the loss as surely as one on a valid token.
    """
    return torch.stack([(~torch.isfinite(data.batch[key])).sum().float().cpu() for key in keys])


class UpdateLoop(ABC):
    """Mini-batch training under the optimizer-step contract, for any role.

    Args:
        config: the model's section (``actor_rollout_ref.actor`` or ``critic``) with ``ppo_mini_batch_size`` in
            samples per rank (see :meth:`~verl.workers.config.TrainedModelConfig.per_rank`).
        optimizer: an optimizer with megatron-core's contract: ``step() -> (successful, grad_norm, num_zeros)``,
            ``get_loss_scale()``, ``zero_grad()``, ``backward(loss)``, ``state_dict()``; None for a frozen model.
        lr_scheduler: stepped once per training step in which at least one update succeeded.
        backend: how the model trains on its backend (:class:`~verl.workers.actor.backend.DPBackend`,
            ``FSDPBackend``, the megatron backends of :mod:`verl.workers.actor.megatron_backend`).
        update_outcome_handler: decides what a failed update means (None for a frozen model).
        fault_injector: the fire drill (None: off).
        rank: data-parallel rank.

    The role ("actor" or "critic") comes from the config's class: it prefixes metrics and is reported in every
    outcome.
    """

    # the mini-batch whose micro-batches are being accumulated (None outside :meth:`update`)
    current_mini_batch: DataProto | None = None
    # whether a micro-batch loss of the current mini-batch was inf/NaN (a 0-d bool tensor: no host sync per loss)
    _nonfinite_loss: torch.Tensor | None = None
    #: The ``peft.PeftModel`` around the module when it trains LoRA adapters (set by the worker); checkpoints then
    #: also write the adapter directory.
    peft_model = None

    def __init__(
        self,
        config: TrainedModelConfig,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        *,
        backend: TrainingBackend,
        update_outcome_handler: UpdateOutcomeHandler | None = None,
        fault_injector: FaultInjector | None = None,
        rank: int = 0,
    ):
        self.config = config
        self.role = type(config).ROLE
        if optimizer is not None and update_outcome_handler is None:
            raise ValueError(f"{self.role}: a trained model needs an update-outcome handler (see build_loop_parts).")
        assert isinstance(backend.fire_drill_target, FireDrillTarget), backend.fire_drill_target
        self.backend = backend
        self.rank = rank
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.update_outcome_handler = update_outcome_handler
        self.fault_injector = fault_injector if fault_injector is not None else FaultInjector(rank=rank)
        self.dtype = TORCH_DTYPES[config.dtype]
        self.num_update_steps = 0
        self.num_failed_updates = 0  # failed updates since the run began (resumed parts included)
        self.mini_batch_size = config.ppo_mini_batch_size
        self.micro_batch_size = config.ppo_micro_batch_size_per_gpu
        self.micro_batching = config.train_micro_batching()
        if not config.use_dynamic_bsz and self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"{type(config).KEY}: the per-rank mini-batch ({self.mini_batch_size} samples) must be a multiple of "
                f"ppo_micro_batch_size_per_gpu ({self.micro_batch_size})."
            )
        # everything the backend trains with, once: it never reads the loop's members
        backend.attach(
            BackendParts(self.model_module(), optimizer, self.dtype, self.micro_batching, self.fault_injector)
        )

    # ------------------------------------------------------------------ what a model's class provides

    @abstractmethod
    def model_module(self) -> torch.nn.Module:
        """The trained module (unwrapped), whose state_dict is the checkpointed weights."""

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates (the fire drill poisons their gradients)."""
        return [p for p in self.model_module().parameters() if p.requires_grad]

    def autocast(self):
        """Mixed-precision context for forward passes (fp32 master weights, fp16/bf16 compute), the backend's."""
        return self.backend.autocast()

    # ------------------------------------------------------------------ what a role provides

    @abstractmethod
    def _update_batch_keys(self, data: DataProto) -> list[str]:
        """The batch keys one update reads (``data`` may tell which optional keys are present)."""

    @abstractmethod
    def _update_temperature(self, data: DataProto) -> float | None:
        """The sampling temperature the update's log-probs are computed at (None: the role computes none).

        Raises:
            ValueError: the role needs it and ``data.meta_info`` lacks it.
        """

    @abstractmethod
    def _micro_batch_loss(self, micro: DataProto, temperature: float | None) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one micro-batch (with gradients) and its metrics (reduced by mean over a step)."""

    def _loss_from_model_output(
        self, micro: DataProto, output: torch.Tensor, temperature: float | None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one micro-batch from the model output a backend's own schedule computed (megatron-core's)."""
        raise NotImplementedError(f"{self.role}: no loss from a backend-run forward pass (no megatron-core schedule).")

    # ------------------------------------------------------------------ the loop

    def _loss_aggregation(self) -> str:
        """How the micro-batch loss aggregates (an ``agg_loss`` mode, or ``"row-mean"``); the role may override."""
        return self.config.loss_agg_mode

    def _micro_batch_weight(self, micro: DataProto, mini: DataProto) -> float:
        """The micro-batch's share of the mini-batch, so that accumulated gradients equal the mini-batch loss's.

        The share follows the loss's aggregation (:meth:`_loss_aggregation`, see :func:`loss_share`).
        """
        return loss_share(micro.batch["response_mask"], mini.batch["response_mask"], self._loss_aggregation())

    def _backward_mini_batch(self, mini: DataProto, temperature: float | None) -> list[dict[str, float]]:
        """Forward and backward every micro-batch of ``mini``, accumulating gradients; returns their metrics."""
        batch = MiniBatchLoss(
            mini=mini,
            temperature=temperature,
            update_step=self.num_update_steps + 1,  # the update this mini-batch's gradients feed
            loss=lambda micro: self._micro_batch_loss(micro, temperature),
            loss_from_output=lambda micro, output: self._loss_from_model_output(micro, output, temperature),
            weight=lambda micro: self._micro_batch_weight(micro, mini),
            note_loss=self.note_loss,
        )
        return self.backend.backward_mini_batch(batch)

    def note_loss(self, loss: torch.Tensor) -> None:
        """Record whether a micro-batch's unscaled loss is inf/NaN; every backend calls this for each loss it is
        about to run backward on, before any loss scaling or fire-drill poisoning."""
        nonfinite = ~torch.isfinite(loss.detach()).all()
        self._nonfinite_loss = nonfinite if self._nonfinite_loss is None else self._nonfinite_loss | nonfinite

    def _take_nonfinite_loss(self) -> bool:
        """Whether any rank saw an inf/NaN loss in this mini-batch (agreed: one collective); resets the record."""
        nonfinite, self._nonfinite_loss = self._nonfinite_loss, None
        flag = torch.zeros(1) if nonfinite is None else nonfinite.float().reshape(1).cpu()
        return bool(sum_over_ranks(flag).item() > 0)

    def _failed_outcome(self, cause: FailureCause, **details) -> UpdateOutcome:
        """An update skipped before the optimizer step (the step counts as attempted, the loss scale is unchanged)."""
        self.num_update_steps += 1
        self.optimizer.zero_grad()
        return UpdateOutcome(
            successful=False,
            grad_norm=None,
            num_zeros_in_grad=None,
            loss_scale=self.backend.loss_scale(),
            min_loss_scale=self.backend.min_loss_scale(),
            step=self.num_update_steps,
            role=self.role,
            cause=cause,
            **details,
        )

    def _optimizer_step(self) -> UpdateOutcome:
        """One optimizer step, reported as an :class:`UpdateOutcome` (computed from globally reduced values).

        A mini-batch whose loss was inf/NaN on any rank is not stepped: no loss scale explains it, so the scaler
        must not back off; the outcome's cause says so (``nonfinite_loss``). Otherwise a failed step is a
        scaled-gradient overflow under a loss scaler and non-finite gradients without one.
        """
        if self._take_nonfinite_loss():
            return self._failed_outcome(FailureCause.NONFINITE_LOSS)
        self.num_update_steps += 1
        step = self.num_update_steps
        if self.backend.fire_drill_target is FireDrillTarget.GRADIENTS:  # else the backward poisoned the losses
            self.fault_injector.maybe_poison(step, self.trainable_parameters())
        loss_scale = self.backend.loss_scale()  # the scale this step's gradients were computed with
        successful, grad_norm, num_zeros = self.backend.step()
        return UpdateOutcome(
            successful=bool(successful),
            grad_norm=None if grad_norm is None else float(grad_norm),
            num_zeros_in_grad=None if num_zeros is None else int(num_zeros),
            loss_scale=loss_scale,
            min_loss_scale=self.backend.min_loss_scale(),
            step=step,
            role=self.role,
            cause=None if successful else self._step_failure_cause(loss_scale),
        )

    @staticmethod
    def _step_failure_cause(loss_scale: float | None) -> FailureCause:
        return FailureCause.SCALED_GRAD_OVERFLOW if loss_scale is not None else FailureCause.NONFINITE_GRADS

    def _nonfinite_inputs(self, data: DataProto, read_keys: list[str]) -> dict[str, int]:
        """The loss inputs of ``data`` that hold inf/NaN, with their counts of tokens summed over the ranks
        (one collective, every rank the same answer); empty when all are finite or only an unread key is bad."""
        keys = [key for key in LOSS_INPUT_KEYS if key in data.batch.keys()]
        if not keys:
            return {}
        local = count_nonfinite_inputs(data, keys)
        if self.backend.holds_a_copy_of_rows():
            local = torch.zeros_like(local)  # the same rows are counted on the rank they are copied from
        counts = dict(zip(keys, (int(c) for c in sum_over_ranks(local).tolist())))
        if not any(counts[key] for key in keys if key in read_keys):
            return {}  # e.g. NaN rewards whose advantages came out finite (a filtered group): the update is sound
        return {key: count for key, count in counts.items() if count}

    def update(self, data: DataProto) -> UpdateResult:
        """Train on ``data`` (rows of this rank): one training step.

        Returns:
            The step's :class:`~verl.workers.update_outcome.UpdateResult`: its outcomes in order, the run's counts of
            attempted and failed updates, and its metrics reduced over its updates (for the logs).

        Raises:
            UpdateFailedError: when the update-failure policy stops the run.
            ValueError: a frozen model, a batch that does not split into mini-batches, or one without what the role
                needs (the actor's ``meta_info["temperature"]``).
        """
        if self.optimizer is None:
            raise ValueError(f"{self.role}: this model is frozen (built without an optimizer); it cannot train.")
        temperature = self._update_temperature(data)
        read_keys = self._update_batch_keys(data)
        metrics = StepMetrics()
        nonfinite_inputs = self._nonfinite_inputs(data, read_keys)
        if nonfinite_inputs:  # nothing is computed: one failed update, handled as any other
            outcome = self._failed_outcome(FailureCause.NONFINITE_INPUTS, nonfinite_inputs=nonfinite_inputs)
            self._handle(outcome, metrics)
            return self._result([outcome], metrics)
        data = data.select(batch_keys=read_keys)
        if len(data) % self.mini_batch_size:
            raise ValueError(
                f"{self.role}: {len(data)} samples on this rank do not split into mini-batches of "
                f"{self.mini_batch_size}; make the batch a multiple of the mini-batch size."
            )
        seed = self.config.seed + self.num_update_steps if self.config.shuffle else None
        outcomes = []
        minis = data.make_iterator(self.mini_batch_size, self.config.ppo_epochs, seed=seed)
        for index, mini in enumerate(minis, start=1):
            # the profiler's range of this mini-batch, and a step of its schedule (nothing while none is open)
            with profiled_mini_batch(index):
                self.current_mini_batch = mini  # what a role's loss may weigh its terms against (see the actor's)
                try:
                    for micro_metrics in self._backward_mini_batch(mini, temperature):
                        metrics.add(micro_metrics)
                finally:
                    self.current_mini_batch = None
                outcomes.append(self._optimizer_step())
                self._handle(outcomes[-1], metrics)
        if any(outcome.successful for outcome in outcomes) and self.lr_scheduler is not None:
            self.lr_scheduler.step()  # a step in which no update succeeded does not advance the schedule
        return self._result(outcomes, metrics)

    def _handle(self, outcome: UpdateOutcome, metrics: StepMetrics) -> bool:
        """Count a failed ``outcome``, hand it to the policy (which may raise) and add its metrics; returns whether
        it succeeded."""
        if not outcome.successful:
            self.num_failed_updates += 1
        reductions = {
            f"{self.role}/{name}": how for name, how in self.update_outcome_handler.metric_reductions().items()
        }
        metrics.add(self.update_outcome_handler.handle(outcome), reductions)
        if outcome.successful:
            metrics.add({f"{self.role}/grad_norm": outcome.grad_norm})
        return outcome.successful

    def _result(self, outcomes: list[UpdateOutcome], metrics: StepMetrics) -> UpdateResult:
        """The step's result: its outcomes, the run's counts, and its metrics reduced over its updates with the
        update counts and the learning rate."""
        num_successful = sum(outcome.successful for outcome in outcomes)
        reduced = metrics.reduce()
        reduced[f"{self.role}/num_updates_successful"] = float(num_successful)
        reduced[f"{self.role}/num_updates_attempted"] = float(self.num_update_steps)
        reduced[f"{self.role}/lr"] = float(self.optimizer.param_groups[0]["lr"])
        return UpdateResult(
            role=self.role,
            outcomes=tuple(outcomes),
            num_attempted_total=self.num_update_steps,
            num_failed_total=self.num_failed_updates,
            metrics=reduced,
        )

    # ------------------------------------------------------------------ checkpoint state

    def training_state_dict(self, parts: tuple[str, ...] = TRAINING_STATE_PARTS) -> dict[str, Any]:
        """Everything but the weights, as far as ``parts`` asks (``checkpoint.save_contents``): ``optimizer`` (its
        state, with the loss scaler), ``extra`` (LR schedule, handler, step counters); a part left out is None.
        ``training_state_parts`` lists the parts it holds."""
        optimizer, extra = "optimizer" in parts, "extra" in parts
        return {
            PARTS_KEY: [part for part in TRAINING_STATE_PARTS if part in parts],
            "optimizer": self.optimizer.state_dict() if optimizer else None,
            "lr_scheduler": None if self.lr_scheduler is None or not extra else self.lr_scheduler.state_dict(),
            "update_outcome_handler": self.update_outcome_handler.state_dict() if extra else None,
            "num_update_steps": self.num_update_steps if extra else None,
            "num_failed_updates": self.num_failed_updates if extra else None,
        }

    def load_training_state_dict(self, state: dict[str, Any], parts: tuple[str, ...] = TRAINING_STATE_PARTS) -> None:
        """Restore the ``parts`` of :meth:`training_state_dict` (``checkpoint.load_contents``; the checkpoint holds
        them, :func:`~verl.workers.actor.backend.check_checkpoint_parts`); the others stay as built (fresh)."""
        if "optimizer" in parts:
            self.optimizer.load_state_dict(state["optimizer"])
        if "extra" not in parts:
            return
        if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.update_outcome_handler.load_state_dict(state["update_outcome_handler"])
        self.num_update_steps = int(state["num_update_steps"])
        if "num_failed_updates" in state:
            self.num_failed_updates = int(state["num_failed_updates"])
        else:
            # A checkpoint written before the loop kept its own count: every failed outcome went to the handler, so
            # its total failures is the same count; a handler that keeps none leaves 0 (nothing better is known).
            handler_state = state["update_outcome_handler"] or {}
            self.num_failed_updates = int(handler_state.get("num_total_failures", 0))

    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        """Weights and training state into ``directory``, as the backend writes them (see its ``save_checkpoint``);
        the training state's parts as ``checkpoint.save_contents`` names them.

        The caller makes the directory atomic (see :func:`verl.utils.checkpoint.atomic_directory`).
        """
        self.backend.save_checkpoint(directory, self._checkpoint_contents())

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Restore what :meth:`save_checkpoint` wrote: weights, and of optimizer (with the loss scaler) and extra
        (LR schedule, handler, counters) those ``checkpoint.load_contents`` names; the others start fresh.

        Raises:
            CheckpointError: the checkpoint lacks a part ``checkpoint.load_contents`` asks for (checked before
                anything is loaded), or a file is missing or damaged.
        """
        contents = self._checkpoint_contents()
        section_key = getattr(type(self.config), "KEY", self.role)
        check_checkpoint_parts(directory, contents.loaded_parts, section_key)
        fresh = [part for part in TRAINING_STATE_PARTS if part not in contents.loaded_parts]
        if fresh:
            logger.warning(
                "%s: resuming from %s without %s (%s.checkpoint.load_contents): %s; the resume is not exact",
                self.role,
                directory,
                fresh,
                section_key,
                "; ".join(_FRESH[part] for part in fresh),
            )
        self.backend.load_checkpoint(directory, contents)

    def _checkpoint_contents(self) -> CheckpointContents:
        """What the backend writes beside its own files, and how the training state is restored."""
        checkpoint = getattr(self.config, "checkpoint", None)  # a section only some roles have
        saved = TRAINING_STATE_PARTS if checkpoint is None else checkpoint.saved_parts
        loaded = TRAINING_STATE_PARTS if checkpoint is None else checkpoint.loaded_parts
        return CheckpointContents(
            module=self.model_module(),
            training_state=lambda: self.training_state_dict(saved),
            load_training_state=lambda state: self.load_training_state_dict(state, loaded),
            hf_model=bool(checkpoint is not None and checkpoint.hf_model),
            peft_model=self.peft_model,
            saved_parts=saved,
            loaded_parts=loaded,
        )


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
