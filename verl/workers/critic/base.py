"""The PPO critic: a value model trained on the same update loop, under the same optimizer-step contract.

:class:`BasePPOCritic` is the actor's sibling on :class:`~verl.workers.actor.update_loop.UpdateLoop`: its loss is
the clipped value loss instead of the policy loss, and everything else is the loop's — mini-/micro-batches,
gradient accumulation weights, ``_optimizer_step`` -> :class:`~verl.workers.update_outcome.UpdateOutcome`
(``role="critic"``) -> the handler built from ``critic.update_failure_policy``, the fire drill under
``critic.fault_injection``, the LR-schedule rule and the checkpoint with handler and loss-scaler state. A failed
critic update is therefore judged by exactly the code that judges a failed actor update. A model's class only says
how to run its value model forward (:meth:`BasePPOCritic._forward_values`) and on which
:class:`~verl.workers.actor.backend.TrainingBackend` it trains. The critic samples nothing, so unlike the actor it
needs no temperature.
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from verl.algorithms.core_algos import compute_value_loss
from verl.protocol import DataProto
from verl.utils.micro_batching import split_by_length
from verl.utils.padding_free import pad_response_columns, trim_padding_columns
from verl.utils.torch_functional import masked_mean
from verl.workers.actor.update_loop import UpdateLoop
from verl.workers.update_outcome import UpdateResult

# The value head's initial weight is small and seeded: the first values are near zero and runs reproducible.
DEFAULT_HEAD_INIT_STD = 1e-3

CRITIC_UPDATE_KEYS = [
    "input_ids",
    "attention_mask",
    "position_ids",
    "responses",
    "response_mask",
    "values",
    "returns",
]
# what the driver sends an update: its keys, and the rewards for the check of the loss's inputs (see UpdateLoop)
CRITIC_UPDATE_READS = [*CRITIC_UPDATE_KEYS, "token_level_rewards"]
VALUE_KEYS = ["input_ids", "attention_mask", "position_ids", "responses"]


def response_values(values: torch.Tensor, response_length: int) -> torch.Tensor:
    """The values of the response positions, aligned like the log-probs.

    The value at sequence position ``P + t - 1`` (the last token before response token ``t``) estimates the state
    in which token ``t`` is chosen, exactly where the log-prob of token ``t`` is read from the logits.

    Args:
        values: (B, S) per-position values of the whole sequence.
        response_length: R, the number of response positions at the end of the sequence.

    Returns:
        (B, R) float32 values.
    """
    seq_len = values.shape[-1]
    return values[:, seq_len - response_length - 1 : seq_len - 1].float()


@torch.no_grad()
def init_value_head_(head: torch.nn.Linear, *, seed: int, std: float = DEFAULT_HEAD_INIT_STD) -> None:
    """Initialise a ``Linear(hidden, 1)`` value head in place: weight ~ N(0, std) from its own seed, bias 0.

    The head's own generator keeps the global random state untouched, so the critic's seed alone decides it.
    """
    if std < 0:
        raise ValueError(f"the value head's init std must be >= 0, got {std}.")
    generator = torch.Generator().manual_seed(int(seed))
    head.weight.copy_(torch.randn(head.weight.shape, generator=generator) * std)
    head.bias.zero_()


class BasePPOCritic(UpdateLoop):
    """The critic on every backend (role ``"critic"``); see :class:`UpdateLoop` for the arguments."""

    # ------------------------------------------------------------------ what a model's class provides

    @abstractmethod
    def _forward_values(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        """Per-position values (B, S) of the whole sequence."""

    # ------------------------------------------------------------------ values

    def _forward_response_values(self, micro: DataProto) -> torch.Tensor:
        """(B, R) float32 values of the response positions of one micro-batch (with gradients)."""
        batch = micro.batch
        response_length = batch["responses"].shape[-1]
        input_ids, attention_mask, position_ids, kept = trim_padding_columns(
            batch["input_ids"], batch["attention_mask"], batch["position_ids"], response_length
        )
        with self.autocast():
            values = self._forward_values(input_ids, attention_mask, position_ids)
        return pad_response_columns(response_values(values, kept), response_length)

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values of the response positions, zero where ``response_mask`` is 0 (when the batch has one).

        Args:
            data: rows with ``input_ids``, ``attention_mask``, ``position_ids`` (B, P+R), ``responses`` (B, R)
                and optionally ``response_mask`` (B, R).

        Returns:
            (B, R) float32 values; micro-batched by ``critic.forward_micro_batch_size_per_gpu`` (or by
            ``critic.forward_max_token_len_per_gpu`` tokens with ``critic.use_dynamic_bsz``).
        """
        has_mask = "response_mask" in data.batch.keys()
        keys = VALUE_KEYS + (["response_mask"] if has_mask else [])
        chunks = []
        micro_batches, restore = split_by_length(
            data.select(batch_keys=keys), self.config.forward_micro_batching(), self.backend.lockstep()
        )
        for micro in micro_batches:
            values = self._forward_response_values(micro)
            if has_mask:
                values = values * micro.batch["response_mask"].to(values.dtype)
            chunks.append(values)
        return torch.cat(chunks)[restore]

    # ------------------------------------------------------------------ the update

    def _micro_batch_loss(self, micro: DataProto, temperature: None) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped value loss of one micro-batch, and its ``critic/...`` metrics (there is no temperature)."""
        return self._loss_from_values(micro, self._forward_response_values(micro))

    def _loss_from_values(self, micro: DataProto, vpreds: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped value loss of one micro-batch from its response values ``vpreds`` (B, R), and its metrics."""
        batch = micro.batch
        mask = batch["response_mask"]
        vf_loss, vf_clipfrac = compute_value_loss(
            vpreds,
            batch["returns"],
            batch["values"],
            mask,
            cliprange_value=self.config.cliprange_value,
            loss_agg_mode=self.config.loss_agg_mode,
        )
        metrics = {
            "critic/vf_loss": vf_loss.item(),
            "critic/vf_clipfrac": float(vf_clipfrac),
            "critic/vpred_mean": masked_mean(vpreds.detach(), mask).item(),
        }
        return vf_loss, metrics

    def _update_batch_keys(self, data: DataProto) -> list[str]:
        return list(CRITIC_UPDATE_KEYS)

    def _update_temperature(self, data: DataProto) -> None:
        return None  # values do not depend on a sampling temperature

    def update_critic(self, data: DataProto) -> UpdateResult:
        """Train the value model on ``data`` (rows of this rank): one training step.

        Args:
            data: rows with :data:`CRITIC_UPDATE_KEYS`: the sequence tensors (B, P+R), ``responses``,
                ``response_mask``, the old ``values`` and the ``returns`` (B, R).

        Returns:
            The step's result: its outcomes, the run's counts of attempted and failed updates, and in ``metrics``
            the ``critic/...`` metrics reduced over its updates (value loss, clip fraction, handler counters, grad
            norm, lr).

        Raises:
            UpdateFailedError: when the critic's update-failure policy stops the run.
        """
        return self.update(data)
