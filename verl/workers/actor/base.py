"""The PPO actor: the policy loss on the shared update loop, and log-probs for rollout, old and reference passes.

:class:`BasePPOActor` adds to :class:`~verl.workers.actor.update_loop.UpdateLoop` what is the policy's: the
log-probs of response tokens (:meth:`BasePPOActor.compute_log_prob`), and the loss of a micro-batch (policy loss
from the registry, optional entropy bonus, optional KL loss to the reference). A backend supplies the forward pass
(:meth:`BasePPOActor.forward_logits`, public: the in-house rollout samples from it too) and its module.
"""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections.abc import Callable

import torch

from verl.algorithms.core_algos import (
    agg_loss,
    compute_policy_loss_bypass_mode,
    get_policy_loss_fn,
    kl_penalty,
    loss_aggregation,
    loss_share,
)
from verl.models.decoding import IncrementalDecoder, RecomputeDecoder
from verl.protocol import DataProto
from verl.utils.micro_batching import split_by_length
from verl.utils.padding_free import pad_response_columns, trim_padding_columns
from verl.utils.torch_functional import compute_response_log_probs
from verl.workers.actor.update_loop import UpdateLoop
from verl.workers.config.roles import MicroBatching
from verl.workers.update_outcome import UpdateResult

UPDATE_KEYS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask", "advantages"]
# read when the batch has them: the engine's log-probs (mismatch metrics, bypass/reinforce) and importance weights
OPTIONAL_UPDATE_KEYS = ["rollout_log_probs", "rollout_is_weights"]
LOG_PROB_KEYS = ["input_ids", "attention_mask", "position_ids", "responses"]
# every tensor update_policy may read: the driver sends the update these and nothing else of the batch
# (the rewards only for the check of the loss's inputs, which names them as the source of non-finite advantages)
UPDATE_READS = [*UPDATE_KEYS, "old_log_probs", "ref_log_prob", *OPTIONAL_UPDATE_KEYS, "token_level_rewards"]


def require_temperature(meta_info: dict, caller: str) -> float:
    """The sampling temperature in ``meta_info["temperature"]``, which every log-prob computation needs.

    Args:
        meta_info: a batch's ``meta_info``.
        caller: what asks, for the message (``"compute_log_prob"``, ``"update_policy"``).

    Raises:
        ValueError: the key is missing, or its value is not a number >= 0.
    """
    if "temperature" not in meta_info:
        raise ValueError(
            f"actor.{caller}: the batch's meta_info has no 'temperature'; log-probs are log_softmax(logits / "
            "temperature) at the rollout's sampling temperature, and there is no default. Set "
            "data.meta_info['temperature'] to actor_rollout_ref.rollout.temperature (the workers' compute_log_prob, "
            "compute_ref_log_prob and update_actor do so from the config)."
        )
    temperature = meta_info["temperature"]
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not temperature >= 0:
        raise ValueError(
            f"actor.{caller}: meta_info['temperature'] must be a number >= 0 (0: greedy sampling), got "
            f"{temperature!r}; set it to actor_rollout_ref.rollout.temperature."
        )
    return float(temperature)


class BasePPOActor(UpdateLoop):
    """The actor on every backend (role ``"actor"``); see :class:`UpdateLoop` for the arguments."""

    # this step's policy-gradient variant under rollout correction (from the batch's meta_info), and the engine /
    # trainer log-probs its first forward saw when the step had no separate old-log-prob pass
    _correction: dict | None = None
    _first_forward: list | None = None

    @abstractmethod
    def forward_logits(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        """Full-sequence logits (B, S, V) of the model, in the compute dtype when called under :meth:`autocast`.

        Args:
            input_ids, attention_mask, position_ids: (B, S) int64, left-padded prompts followed by responses.
        """

    def forward_response_logits(self, input_ids, attention_mask, position_ids, response_length: int) -> torch.Tensor:
        """Logits (B, L, V) of at least the last ``response_length + 1`` positions (L <= S), which are all that the
        response's log-probs read; by default the whole sequence's (:meth:`forward_logits`)."""
        return self.forward_logits(input_ids, attention_mask, position_ids)

    def forward_response_log_probs(
        self, input_ids, attention_mask, position_ids, response_length: int, temperature: float, calculate_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (B, R) and entropy (B, R) or None of the response tokens from the model's last hidden states, a
        chunk of tokens at a time (``model.use_fused_kernels``): the whole logits are never formed.

        Args:
            input_ids, attention_mask, position_ids: (B, S) int64, left-padded prompts followed by responses.
            response_length: R, the last R columns.
            temperature: the rollout's sampling temperature.
            calculate_entropy: also return the entropy.
        """
        raise NotImplementedError(f"{type(self).__name__} has no fused log-prob path (model.use_fused_kernels).")

    def adapters_off(self) -> Callable[[], contextlib.AbstractContextManager] | None:
        """A switch (a context-manager factory) that runs the model without its LoRA adapters, for the reference
        policy of a LoRA run; None when the model has none."""
        return None

    def incremental_decoder(self) -> IncrementalDecoder:
        """What the in-house (``naive``) rollout samples with, in the training precision.

        By default the whole sequence is re-run for every token (:meth:`forward_logits`, no cache); backends with a
        key/value cache override this with their cached decoder.
        """

        def logits_fn(input_ids, attention_mask, position_ids):
            with self.autocast():
                return self.forward_logits(input_ids, attention_mask, position_ids).float()

        return RecomputeDecoder(logits_fn)

    # ------------------------------------------------------------------ log-probs

    def _forward_micro_batch(self, micro: DataProto, temperature: float, calculate_entropy: bool):
        """Log-probs (and entropy) of one micro-batch's response tokens, on its columns that hold a real token."""
        batch = micro.batch
        response_length = batch["responses"].shape[-1]
        input_ids, attention_mask, position_ids, kept = trim_padding_columns(
            batch["input_ids"], batch["attention_mask"], batch["position_ids"], response_length
        )
        if self.config.use_fused_kernels:
            with self.autocast():
                log_prob, entropy = self.forward_response_log_probs(
                    input_ids, attention_mask, position_ids, kept, temperature, calculate_entropy
                )
        else:
            with self.autocast():
                logits = self.forward_response_logits(input_ids, attention_mask, position_ids, kept)
            log_prob, entropy = compute_response_log_probs(
                logits, input_ids, kept, temperature, calculate_entropy, **self._entropy_options()
            )
        log_prob = pad_response_columns(log_prob, response_length)
        return log_prob, None if entropy is None else pad_response_columns(entropy, response_length)

    @torch.no_grad()
    def compute_log_prob(
        self, data: DataProto, micro_batching: MicroBatching | None = None, calculate_entropy: bool = False
    ):
        """Log-probs (B, R) of the response tokens, and entropy (B, R) when asked (else None); no gradients.

        Args:
            data: rows with the sequence tensors (B, P+R) and ``responses`` (B, R); ``data.meta_info["temperature"]``
                is the sampling temperature the log-probs are taken at (required).
            micro_batching: how to split the batch (the old-log-prob pass reads ``actor_rollout_ref.rollout``'s
                settings, the reference pass ``actor_rollout_ref.ref``'s); None runs the batch as one.
            calculate_entropy: also return the entropy of each position's distribution.

        Raises:
            ValueError: ``data.meta_info`` has no valid ``temperature``.
        """
        temperature = require_temperature(data.meta_info, "compute_log_prob")
        if micro_batching is None:
            micro_batching = MicroBatching(size=max(len(data), 1), use_dynamic_bsz=False, max_token_len=0)
        log_probs, entropies = [], []
        micro_batches, restore = split_by_length(
            data.select(batch_keys=LOG_PROB_KEYS), micro_batching, self.backend.lockstep()
        )
        for micro in micro_batches:
            log_prob, entropy = self._forward_micro_batch(micro, temperature, calculate_entropy)
            log_probs.append(log_prob.float())
            if calculate_entropy:
                entropies.append(entropy.float())
        entropy = torch.cat(entropies)[restore] if calculate_entropy else None
        return torch.cat(log_probs)[restore], entropy

    # ------------------------------------------------------------------ the loss

    def _update_temperature(self, data: DataProto) -> float:
        return require_temperature(data.meta_info, "update_policy")

    def _loss_aggregation(self) -> str:
        """The policy loss's own aggregation (gspo, sapo and geo_mean fix theirs), which weighs the micro-batches."""
        if self._bypass_settings() is not None:
            return self.config.loss_agg_mode  # the bypass loss replaces the policy loss, and aggregates by the mode
        return loss_aggregation(self.config.policy_loss.loss_mode, self.config.loss_agg_mode)

    def _bypass_settings(self) -> dict | None:
        """``algorithm.rollout_correction`` as the trainer handed it over in bypass mode (or with verl's reinforce
        loss type), else None."""
        correction = self._correction
        if correction is None or not (correction.get("bypass_mode") or correction.get("loss_type") == "reinforce"):
            return None
        return correction

    def _aux_term_scale(self, mask: torch.Tensor) -> float:
        """Factor on the entropy and KL terms (aggregated by ``loss_agg_mode``) of a micro-batch whose whole loss is
        weighted by the policy loss's aggregation: their own share over the policy loss's, so that each term's
        accumulated gradient equals its mini-batch value. 1 when both aggregate alike or outside a mini-batch."""
        pg_mode, own_mode, mini = self._loss_aggregation(), self.config.loss_agg_mode, self.current_mini_batch
        if mini is None or pg_mode == own_mode:
            return 1.0
        mini_mask = mini.batch["response_mask"]
        pg_share = loss_share(mask, mini_mask, pg_mode)
        return loss_share(mask, mini_mask, own_mode) / pg_share if pg_share > 0 else 0.0

    def _micro_batch_loss(self, micro: DataProto, temperature: float) -> tuple[torch.Tensor, dict[str, float]]:
        log_prob, entropy = self._forward_micro_batch(micro, temperature, self.config.entropy_coeff != 0)
        return self._loss_from_log_probs(micro, log_prob, entropy)

    def _loss_from_model_output(self, micro: DataProto, output, temperature: float):
        """The loss from a backend-run forward pass (see :meth:`_log_probs_from_model_output`)."""
        calculate_entropy = self.config.entropy_coeff != 0
        return self._loss_from_log_probs(
            micro, *self._log_probs_from_model_output(micro, output, temperature, calculate_entropy)
        )

    def _log_probs_from_model_output(self, micro: DataProto, output, temperature: float, calculate_entropy: bool):
        """(log-probs, entropy or None) of the response tokens from a backend-run forward pass (no padding
        trimmed): its full-sequence logits (B, S, V), or the pair a fused head computed
        (``model.use_fused_kernels``)."""
        if isinstance(output, tuple):
            return output
        batch = micro.batch
        return compute_response_log_probs(
            output.float(),
            batch["input_ids"],
            batch["responses"].shape[-1],
            temperature,
            calculate_entropy=calculate_entropy,
            **self._entropy_options(),
        )

    def _entropy_options(self) -> dict[str, bool]:
        """How the plain (logits) path computes the entropy: ``actor.entropy_from_logits_with_chunking`` and
        ``actor.entropy_checkpointing`` (or verl's ``actor.fsdp_config.entropy_checkpointing``)."""
        return {
            "entropy_chunking": self.config.entropy_from_logits_with_chunking,
            "entropy_checkpointing": self.config.checkpoints_entropy,
        }

    def _loss_from_log_probs(self, micro: DataProto, log_prob, entropy) -> tuple[torch.Tensor, dict[str, float]]:
        """Policy loss - entropy bonus + KL loss of one micro-batch, from its response log-probs (B, R)."""
        batch, cfg = micro.batch, self.config
        log_prob = log_prob.float()
        mask = batch["response_mask"]
        policy_loss_fn = get_policy_loss_fn(cfg.policy_loss.loss_mode)
        # Without a separate old-log-prob pass the update is on-policy (checked in _update_batch_keys): the weights
        # that sampled the batch are the ones computing log_prob now, so the old log-probs are log_prob itself.
        on_policy = "old_log_probs" not in batch.keys()
        old_log_prob = log_prob.detach() if on_policy else batch["old_log_probs"]
        if on_policy and "rollout_log_probs" in batch.keys() and self._first_forward is not None:
            self._first_forward.append((batch["rollout_log_probs"], log_prob.detach(), mask))
        if self._bypass_settings() is not None:
            # verl's bypass mode: the rollout's log-probs are the old ones, corrected against the current policy
            rollout = batch["rollout_log_probs"] if "rollout_log_probs" in batch.keys() else old_log_prob
            pg_loss, pg_metrics = compute_policy_loss_bypass_mode(
                rollout, log_prob, batch["advantages"], mask, cfg.loss_agg_mode, _BypassView(cfg, self._correction)
            )
        else:
            extra = {"rollout_is_weights": batch["rollout_is_weights"]} if "rollout_is_weights" in batch.keys() else {}
            pg_loss, pg_metrics = policy_loss_fn(
                old_log_prob, log_prob, batch["advantages"], mask, loss_agg_mode=cfg.loss_agg_mode, config=cfg, **extra
            )
        loss = pg_loss
        metrics = {"actor/pg_loss": pg_loss.item()}
        # a loss's own metrics get the role; rollout_corr/... ones are logged as verl names them
        metrics.update({(k if "/" in k else f"actor/{k}"): float(v) for k, v in pg_metrics.items()})
        aux_scale = self._aux_term_scale(mask) if cfg.entropy_coeff != 0 or cfg.use_kl_loss else 1.0
        agg_kwargs = {"loss_scale_factor": cfg.loss_scale_factor}
        if cfg.entropy_coeff != 0:
            entropy_loss = agg_loss(entropy.float(), mask, cfg.loss_agg_mode, **agg_kwargs)
            loss = loss - cfg.entropy_coeff * aux_scale * entropy_loss
            metrics["actor/entropy"] = entropy_loss.item()
        if cfg.use_kl_loss:
            kl = kl_penalty(log_prob, batch["ref_log_prob"], cfg.kl_loss_type)
            kl_loss = agg_loss(kl, mask, cfg.loss_agg_mode, **agg_kwargs)
            loss = loss + cfg.kl_loss_coef * aux_scale * kl_loss
            metrics["actor/kl_loss"] = kl_loss.item()
        return loss, metrics

    def _update_batch_keys(self, data: DataProto) -> list[str]:
        """The batch keys the update reads; ``old_log_probs`` may be left out only for one on-policy update."""
        keys = list(UPDATE_KEYS)
        if "old_log_probs" in data.batch.keys():
            keys.append("old_log_probs")
        else:
            epochs = self.config.ppo_epochs
            if epochs != 1 or len(data) != self.mini_batch_size:
                raise ValueError(
                    f"actor: the batch has no old_log_probs, which only a single on-policy update can do without "
                    f"(ppo_epochs 1 and one mini-batch); here ppo_epochs={epochs} and {len(data)} samples in "
                    f"mini-batches of {self.mini_batch_size}. Compute them with compute_log_prob first."
                )
        if self.config.use_kl_loss:
            keys.append("ref_log_prob")
        return keys + [key for key in OPTIONAL_UPDATE_KEYS if key in data.batch.keys()]

    def update_policy(self, data: DataProto) -> UpdateResult:
        """Train the policy on ``data`` (rows of this rank); returns the step's result (outcomes, the run's counts of
        attempted and failed updates, and the ``actor/...`` metrics in ``result.metrics``).

        Args:
            data: rows with the sequence tensors (B, P+R), ``responses``, ``response_mask``, ``advantages`` (B, R),
                ``old_log_probs`` (B, R) unless the step is one on-policy update, and ``ref_log_prob`` with a KL loss;
                ``meta_info["temperature"]``, the sampling temperature (required).

        Raises:
            UpdateFailedError: when the actor's update-failure policy stops the run.
            ValueError: ``data.meta_info`` has no valid ``temperature``, or the batch lacks what the update reads.

        ``data.meta_info["rollout_correction"]`` (set by the trainer in bypass mode: ``algorithm.rollout_correction``
        as a dict) switches the policy loss to verl's ``bypass_mode`` loss, which weighs and rejects against the
        current policy and reports ``rollout_corr/...`` metrics. Without ``old_log_probs`` but with
        ``rollout_log_probs``, the mismatch metrics are taken against the update's own first forward (the old policy
        of a single on-policy update).
        """
        from verl.algorithms.rollout_corr import compute_mismatch_metrics

        self._correction = data.meta_info.get("rollout_correction")
        self._first_forward = [] if "old_log_probs" not in data.batch.keys() else None
        try:
            result = self.update(data)
            if self._first_forward:
                engine, trainer, mask = (torch.cat(parts) for parts in zip(*self._first_forward))
                result = result.with_metrics(compute_mismatch_metrics(engine, trainer, mask))
        finally:
            self._correction, self._first_forward = None, None
        return result


class _BypassView:
    """The actor config as the ``bypass_mode`` loss reads it: every key as is, and ``policy_loss.rollout_correction``
    (what verl's trainer attaches to its mutable config at run time) from the settings the trainer handed over."""

    def __init__(self, config, correction: dict):
        self._config = config
        self.policy_loss = _PolicyLossView(config.policy_loss, correction)

    def __getattr__(self, name):
        return getattr(self._config, name)


class _PolicyLossView:
    def __init__(self, section, correction: dict):
        self._section = section
        self.rollout_correction = correction

    def __getattr__(self, name):
        return getattr(self._section, name)
