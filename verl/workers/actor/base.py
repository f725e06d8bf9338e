"""The PPO actor's shared loop and its optimizer-step contract.

Both backends train the same way: ``ppo_epochs`` x mini-batches x micro-batches, a policy loss (plus optional
entropy bonus and KL loss to the reference), gradient accumulation, one optimizer step per mini-batch. The step
always ends as ``outcome = self._optimizer_step()`` followed by ``self.update_outcome_handler.handle(outcome)``:
the actor never branches on success itself, so what a failed update means is decided by the configured policy
alone. A backend supplies the forward pass (:meth:`BasePPOActor._forward_logits`) and an optimizer with
megatron-core's ``step()`` contract; the megatron GPU path also replaces :meth:`BasePPOActor._backward_mini_batch`
with megatron-core's schedule.
"""

from __future__ import annotations

import contextlib
import logging
import os
from abc import ABC, abstractmethod
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
from verl.utils.checkpoint import load_state, load_weights, save_state, save_weights
from verl.utils.config import cfg_get as _cfg
from verl.utils.torch_functional import compute_response_log_probs
from verl.workers.actor.fault_injection import FaultInjector
from verl.workers.update_outcome import UpdateOutcome, build_update_outcome_handler

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
UPDATE_KEYS = [
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "advantages",
]
# Handler metrics are counters: a training step reports their last value, and whether any update failed.
_LAST_VALUE_SUFFIXES = ("update_failures_consecutive", "update_failures_total", "update_failures_unabsorbed")


def resolve_dtype(name: str, key: str) -> torch.dtype:
    """``"float16"`` -> ``torch.float16``; unknown names raise ``ValueError`` naming ``key``."""
    if name not in DTYPES:
        raise ValueError(f"{key}={name!r} is not supported; use one of {sorted(DTYPES)}.")
    return DTYPES[name]


def _tied_aliases(weights: dict[str, torch.Tensor]) -> set[str]:
    # Tied output weights are saved once under the embedding name by some models; nothing is missing then.
    return {"lm_head.weight"} if "model.embed_tokens.weight" in weights else set()


def reduce_step_metrics(metrics: dict[str, list[float]]) -> dict[str, float]:
    """Mean of each metric over a training step, except handler counters (last value) and failures (max)."""
    reduced = {}
    for key, values in metrics.items():
        if not values:
            continue
        if key.endswith(_LAST_VALUE_SUFFIXES):
            reduced[key] = float(values[-1])
        elif key.endswith("/update_failed"):
            reduced[key] = float(max(values))
        else:
            reduced[key] = float(sum(values) / len(values))
    return reduced


class BasePPOActor(ABC):
    """The actor loop shared by every backend.

    Args:
        config: the ``actor_rollout_ref.actor`` config (per-rank ``ppo_mini_batch_size`` already normalised by the
            worker: samples per rank, not prompts).
        optimizer: an optimizer with megatron-core's contract: ``step() -> (successful, grad_norm, num_zeros)``,
            ``get_loss_scale()``, ``zero_grad()``, ``backward(loss)``, ``state_dict()``.
        lr_scheduler: stepped once per training step in which at least one update succeeded.
        rank: data-parallel rank (for the fire drill and logging).
        role: "actor" (or "critic" for value models): prefixes metrics and names the config key in errors.
    """

    # Where the fire drill strikes: False poisons the gradients before the optimizer step (the optimizer reduces
    # them itself); a backend whose gradients are reduced inside its backward schedule poisons the losses instead.
    fire_drill_poisons_loss = False

    def __init__(self, config: Any, optimizer: Any, lr_scheduler: Any = None, rank: int = 0, role: str = "actor"):
        self.config = config
        self.role = role
        self.rank = rank
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        prefix = "actor_rollout_ref.actor" if role == "actor" else role
        self.dtype = resolve_dtype(_cfg(config, "dtype", "float32"), f"{prefix}.dtype")
        self.update_outcome_handler = build_update_outcome_handler(
            _cfg(config, "update_failure_policy", "auto"), dtype=self.dtype, role=role
        )
        self.fault_injector = FaultInjector.from_config(
            _cfg(config, "fault_injection"), rank=rank, config_prefix=f"{prefix}.fault_injection"
        )
        self.num_update_steps = 0
        self.mini_batch_size = int(_cfg(config, "ppo_mini_batch_size"))
        self.micro_batch_size = int(_cfg(config, "ppo_micro_batch_size_per_gpu"))
        if self.mini_batch_size < 1 or self.micro_batch_size < 1 or self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"{prefix}: the per-rank mini-batch ({self.mini_batch_size} samples) must be a positive multiple of "
                f"ppo_micro_batch_size_per_gpu ({self.micro_batch_size})."
            )

    # ------------------------------------------------------------------ what a backend provides

    @abstractmethod
    def _forward_logits(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        """Full-sequence logits (B, S, V) of the trained model."""

    @abstractmethod
    def _trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates (the fire drill poisons their gradients)."""

    def _autocast(self):
        """Mixed-precision context for forward passes (fp32 master weights, fp16/bf16 compute)."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        device = next(self.model_module().parameters()).device.type  # a frozen reference has no trainable ones
        return torch.autocast(device_type=device, dtype=self.dtype)

    def _current_loss_scale(self) -> float | None:
        scale = self.optimizer.get_loss_scale()
        return None if scale is None else float(scale)

    def _min_loss_scale(self) -> float | None:
        return getattr(self.optimizer, "min_loss_scale", None)

    # ------------------------------------------------------------------ log-probs

    def _forward_micro_batch(self, micro: DataProto, temperature: float, calculate_entropy: bool):
        batch = micro.batch
        with self._autocast():
            logits = self._forward_logits(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
        return compute_response_log_probs(
            logits, batch["input_ids"], batch["responses"].shape[-1], temperature, calculate_entropy
        )

    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False):
        """Log-probs (B, R) of the response tokens, and entropy (B, R) when asked (else None); no gradients."""
        temperature = data.meta_info.get("temperature", 1.0)
        micro_size = int(_cfg(self.config, "log_prob_micro_batch_size_per_gpu", None) or self.micro_batch_size)
        keys = ["input_ids", "attention_mask", "position_ids", "responses"]
        log_probs, entropies = [], []
        for micro in data.select(batch_keys=keys).split(micro_size):
            log_prob, entropy = self._forward_micro_batch(micro, temperature, calculate_entropy)
            log_probs.append(log_prob.float())
            if calculate_entropy:
                entropies.append(entropy.float())
        return torch.cat(log_probs), (torch.cat(entropies) if calculate_entropy else None)

    # ------------------------------------------------------------------ the update

    def _micro_batch_loss(self, micro: DataProto, temperature: float) -> tuple[torch.Tensor, dict[str, float]]:
        entropy_coeff = float(_cfg(self.config, "entropy_coeff", 0.0))
        log_prob, entropy = self._forward_micro_batch(micro, temperature, calculate_entropy=entropy_coeff != 0)
        return self._loss_from_log_probs(micro, log_prob, entropy)

    def _loss_from_log_probs(self, micro: DataProto, log_prob, entropy) -> tuple[torch.Tensor, dict[str, float]]:
        """Policy loss - entropy bonus + KL loss of one micro-batch, from its response log-probs (B, R)."""
        batch, cfg = micro.batch, self.config
        entropy_coeff = float(_cfg(cfg, "entropy_coeff", 0.0))
        loss_agg_mode = _cfg(cfg, "loss_agg_mode", "token-mean")
        log_prob = log_prob.float()
        mask = batch["response_mask"]
        policy_loss_fn = get_policy_loss_fn(_cfg(cfg, "policy_loss", "vanilla") or "vanilla")
        # Without a separate old-log-prob pass the update is on-policy (checked in update_policy): the weights that
        # sampled the batch are the ones computing log_prob now, so the old log-probs are log_prob itself.
        old_log_prob = batch["old_log_probs"] if "old_log_probs" in batch.keys() else log_prob.detach()
        pg_loss, pg_metrics = policy_loss_fn(
            old_log_prob, log_prob, batch["advantages"], mask, loss_agg_mode=loss_agg_mode, config=cfg
        )
        loss = pg_loss
        metrics = {f"{self.role}/pg_loss": pg_loss.item()}
        metrics.update({f"{self.role}/{k}": float(v) for k, v in pg_metrics.items()})
        if entropy_coeff != 0:
            entropy_loss = agg_loss(entropy.float(), mask, loss_agg_mode)
            loss = loss - entropy_coeff * entropy_loss
            metrics[f"{self.role}/entropy"] = entropy_loss.item()
        if _cfg(cfg, "use_kl_loss", False):
            kl = kl_penalty(log_prob, batch["ref_log_prob"], _cfg(cfg, "kl_loss_type", "low_var_kl"))
            kl_loss = agg_loss(kl, mask, loss_agg_mode)
            loss = loss + float(_cfg(cfg, "kl_loss_coef", 0.001)) * kl_loss
            metrics[f"{self.role}/kl_loss"] = kl_loss.item()
        return loss, metrics

    def _micro_batch_weight(self, micro: DataProto, mini: DataProto) -> float:
        """The micro-batch's share of the mini-batch, so that accumulated gradients equal the mini-batch loss's.

        token-mean averages over tokens, so the share is by valid tokens; the sequence-mean modes share by rows.
        """
        if _cfg(self.config, "loss_agg_mode", "token-mean") == "token-mean":
            return float(micro.batch["response_mask"].sum()) / max(float(mini.batch["response_mask"].sum()), 1.0)
        return len(micro) / len(mini)

    def _backward_mini_batch(self, mini: DataProto, temperature: float) -> list[dict[str, float]]:
        """Forward and backward every micro-batch of ``mini``, accumulating gradients; returns their metrics."""
        self.optimizer.zero_grad()
        all_metrics = []
        for micro in mini.split(self.micro_batch_size):
            loss, metrics = self._micro_batch_loss(micro, temperature)
            self.optimizer.backward(loss * self._micro_batch_weight(micro, mini))
            all_metrics.append(metrics)
        return all_metrics

    def _optimizer_step(self) -> UpdateOutcome:
        """One optimizer step, reported as an :class:`UpdateOutcome` (computed from globally reduced values)."""
        self.num_update_steps += 1
        step = self.num_update_steps
        if not self.fire_drill_poisons_loss:
            self.fault_injector.maybe_poison(step, self._trainable_parameters())
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

    def _update_batch_keys(self, data: DataProto) -> list[str]:
        """The batch keys the update reads; ``old_log_probs`` may be left out only for one on-policy update."""
        keys = list(UPDATE_KEYS)
        if "old_log_probs" in data.batch.keys():
            keys.append("old_log_probs")
        else:
            epochs = int(_cfg(self.config, "ppo_epochs", 1))
            if epochs != 1 or len(data) != self.mini_batch_size:
                raise ValueError(
                    f"{self.role}: the batch has no old_log_probs, which only a single on-policy update can do "
                    f"without (ppo_epochs 1 and one mini-batch); here ppo_epochs={epochs} and {len(data)} samples "
                    f"in mini-batches of {self.mini_batch_size}. Compute them with compute_log_prob first."
                )
        if _cfg(self.config, "use_kl_loss", False):
            keys.append("ref_log_prob")
        return keys

    def update_policy(self, data: DataProto) -> dict[str, float]:
        """Train on ``data`` (rows of this rank) and return the step's metrics, reduced over its updates."""
        temperature = data.meta_info.get("temperature", 1.0)
        data = data.select(batch_keys=self._update_batch_keys(data))
        if len(data) % self.mini_batch_size:
            raise ValueError(
                f"{self.role}: {len(data)} samples on this rank do not split into mini-batches of "
                f"{self.mini_batch_size}; make the batch a multiple of the mini-batch size."
            )
        epochs = int(_cfg(self.config, "ppo_epochs", 1))
        shuffle = bool(_cfg(self.config, "shuffle", False))
        seed = int(_cfg(self.config, "seed", 0)) + self.num_update_steps if shuffle else None
        metrics: dict[str, list[float]] = defaultdict(list)
        num_successful = 0
        for mini in data.make_iterator(self.mini_batch_size, epochs, seed=seed):
            for micro_metrics in self._backward_mini_batch(mini, temperature):
                for key, value in micro_metrics.items():
                    metrics[key].append(value)
            outcome = self._optimizer_step()
            handler_metrics = self.update_outcome_handler.handle(outcome)
            for key, value in handler_metrics.items():
                metrics[key].append(value)
            if outcome.successful:
                num_successful += 1
                metrics[f"{self.role}/grad_norm"].append(outcome.grad_norm)
        if num_successful and self.lr_scheduler is not None:
            self.lr_scheduler.step()  # a step in which no update succeeded does not advance the schedule
        reduced = reduce_step_metrics(metrics)
        reduced[f"{self.role}/num_updates_successful"] = float(num_successful)
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

    @abstractmethod
    def model_module(self) -> torch.nn.Module:
        """The trained module (unwrapped), whose state_dict is the checkpointed weights."""

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
