"""The ``naive`` rollout: a backend-agnostic batched sampler over any logits function.

It needs nothing from the model but the shared model contract, a callable
``logits_fn(input_ids, attention_mask, position_ids) -> logits (B, S, V)``, so the same sampler drives a Hugging
Face model and a megatron-core ``GPTModel`` without converting weights. There is no KV cache: every step re-runs
the whole sequence under ``torch.no_grad``, which is fine for the tiny models of development and CI and keeps the
sampler independent of how a backend caches. Rows that emitted eos keep being fed padding (mask 0) until every row
has ended or the response length is reached; the shared post-processing then builds the rollout layout. Over a
sharded model (FSDP2), whose every forward pass is a collective, the ranks agree on that stop
(:meth:`NaiveRollout.synchronize_stop`) so that all of them take the same number of steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from verl.workers.rollout.base import BaseRollout, SamplingParams, register_rollout
from verl.workers.rollout.postprocess import compute_position_ids, is_eos
from verl.workers.rollout.sampling import sample_next_token, sampled_token_log_probs

__all__ = ["NaiveRollout"]

LogitsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@register_rollout("naive")
class NaiveRollout(BaseRollout):
    """Sample responses token by token from ``logits_fn``.

    Determinism: with ``seed`` set, the rollout owns a ``torch.Generator`` (one per device) seeded once at first
    use, so a fresh rollout built with the same seed and called with the same batches in the same order yields
    the same responses; successive calls continue the generator's stream, so they differ from each other. The
    generators' states are the rollout's :meth:`state_dict`, so a resumed run continues the stream where the
    checkpoint left it. Without ``seed`` draws use torch's global random state.

    Args:
        logits_fn: ``(input_ids, attention_mask, position_ids) -> logits``, inputs (B, S), output (B, S, V).
        config: the rollout config (``actor_rollout_ref.rollout``), an OmegaConf node or a dict; see
            :class:`~verl.workers.rollout.base.SamplingParams` for the keys used.
        pad_token_id: id written after a row's eos and in right padding.
        eos_token_id: one eos id or a list of them.
    """

    def __init__(
        self,
        logits_fn: LogitsFn,
        config: DictConfig | Mapping[str, Any],
        pad_token_id: int,
        eos_token_id: int | Sequence[int],
    ):
        if not callable(logits_fn):
            raise ValueError(f"NaiveRollout needs a callable logits_fn, got {type(logits_fn).__name__}.")
        super().__init__(config, pad_token_id, eos_token_id)
        self.logits_fn = logits_fn
        self._generators: dict[torch.device, torch.Generator] = {}
        self._stop_group: Any = None

    def synchronize_stop(self, process_group: Any) -> None:
        """Stop before the response length only once every rank of ``process_group`` has ended all its rows.

        A sharded model gathers its parameters from every rank in each forward pass, so a rank that stopped
        early would leave the others waiting in a collective. With this set each step ends with a MIN
        all-reduce of the "all my rows ended" flag (one tiny collective per generated token).
        """
        self._stop_group = process_group

    def _all_finished(self, finished: torch.Tensor) -> bool:
        done = finished.all()
        if self._stop_group is None:
            return bool(done)
        flag = done.to(torch.int32).reshape(1)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._stop_group)
        return bool(flag.item())

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self.params.seed is None:
            return None
        if device not in self._generators:
            generator = torch.Generator(device=device)
            generator.manual_seed(self.params.seed)
            self._generators[device] = generator
        return self._generators[device]

    def state_dict(self) -> dict[str, Any]:
        """The state of each device's generator, ``{"generators": {"cpu": uint8 tensor, "cuda:0": ...}}``.

        Only generators already used appear; a device used for the first time after a load is seeded from
        ``seed`` as usual. The states are CPU ``uint8`` tensors keyed by device string, so the dict loads with
        ``torch.load(..., weights_only=True)``. Without ``seed`` the dict is ``{"generators": {}}``.
        """
        return {"generators": {str(device): gen.get_state() for device, gen in self._generators.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Set the generators to the states :meth:`state_dict` returned (on the devices named there).

        Raises:
            ValueError: ``state`` was saved by another rollout, or holds generator states while this rollout has
                no ``seed`` (its draws come from torch's global random state).
        """
        self._check_state_keys(state, {"generators"})
        saved = state["generators"]
        if saved and self.params.seed is None:
            raise ValueError(
                "The rollout state to load holds seeded generator states, but this rollout has "
                "`actor_rollout_ref.rollout.seed: null`; set the seed as in the run that wrote the checkpoint."
            )
        generators = {}
        for name, generator_state in saved.items():
            device = torch.device(name)
            generator = torch.Generator(device=device)
            # set_state wants a CPU byte tensor whatever the generator's device; a loaded state may sit elsewhere
            generator.set_state(generator_state.to(device="cpu", dtype=torch.uint8))
            generators[device] = generator
        self._generators = generators

    def _last_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        output = self.logits_fn(input_ids, attention_mask, compute_position_ids(attention_mask))
        # Hugging Face models return a ModelOutput; accept it so a bare model call works as logits_fn
        logits = getattr(output, "logits", output)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != input_ids.shape:
            shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise ValueError(
                f"logits_fn must return logits of shape (B, S, V) = {tuple(input_ids.shape)} + (V,), got {shape}."
            )
        return logits[:, -1, :]

    def _generate_tokens(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample token by token, re-running ``logits_fn`` on the whole sequence each step.

        Args:
            input_ids: (B*n, P) prompt ids, left-padded.
            attention_mask: (B*n, P) prompt mask.
            params: the sampling options of this call.

        Returns:
            (B*n, L) sampled tokens, L <= R (L < R only when every row has emitted eos), and their (B*n, L) log-probs
            under the logits they were sampled from.
        """
        num_prompt_tokens = input_ids.shape[1]
        generator = self._generator(input_ids.device)
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        log_probs = []
        for _ in range(params.response_length):
            logits = self._last_logits(input_ids, attention_mask)
            next_tokens = sample_next_token(logits, params, generator)
            next_tokens = next_tokens.masked_fill(finished, self.pad_token_id)
            log_probs.append(sampled_token_log_probs(logits, next_tokens, params))
            input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
            # rows that have ended are fed padding with mask 0, so they no longer affect the positions
            attention_mask = torch.cat([attention_mask, (~finished).long()[:, None]], dim=-1)
            finished |= is_eos(next_tokens, self.eos_ids)
            if self._all_finished(finished):
                break
        return input_ids[:, num_prompt_tokens:], torch.stack(log_probs, dim=-1)
