"""The ``naive`` rollout: a backend-agnostic batched sampler over any logits function.

It needs nothing from the model but the shared model contract, a callable
``logits_fn(input_ids, attention_mask, position_ids) -> logits (B, S, V)``, so the same sampler drives a Hugging
Face model and a megatron-core ``GPTModel`` without converting weights. There is no KV cache: every step re-runs
the whole sequence under ``torch.no_grad``, which is fine for the tiny models of development and CI and keeps the
sampler independent of how a backend caches. Rows that emitted eos keep being fed padding (mask 0) until every row
has ended or the response length is reached; the shared post-processing then builds the rollout layout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from omegaconf import DictConfig

from verl.protocol import DataProto
from verl.workers.rollout.base import BaseRollout, SamplingParams, register_rollout
from verl.workers.rollout.postprocess import (
    as_eos_ids,
    build_rollout_output,
    check_prompts,
    compute_position_ids,
    is_eos,
)
from verl.workers.rollout.sampling import sample_next_token

__all__ = ["NaiveRollout"]

LogitsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@register_rollout("naive")
class NaiveRollout(BaseRollout):
    """Sample responses token by token from ``logits_fn``.

    Determinism: with ``seed`` set, the rollout owns a ``torch.Generator`` (one per device) seeded once at first
    use, so a fresh rollout built with the same seed and called with the same batches in the same order yields
    the same responses; successive calls continue the generator's stream, so they differ from each other. Without
    ``seed`` draws use torch's global random state.

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
        self.logits_fn = logits_fn
        self.params = SamplingParams.from_config(config)
        self.pad_token_id = int(pad_token_id)
        self.eos_ids = as_eos_ids(eos_token_id)
        self._generators: dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self.params.seed is None:
            return None
        if device not in self._generators:
            generator = torch.Generator(device=device)
            generator.manual_seed(self.params.seed)
            self._generators[device] = generator
        return self._generators[device]

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

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate ``n`` responses per prompt.

        Args:
            prompts: ``input_ids``, ``attention_mask``, ``position_ids`` (B, P), left-padded; its ``meta_info``
                may override ``n``, ``temperature``, ``top_k``, ``top_p``, ``do_sample`` for this call.

        Returns:
            The rollout layout for B * n rows (see :class:`BaseRollout`), non-tensors repeated, meta_info kept.
        """
        check_prompts(prompts)
        params = self.params.with_overrides(prompts.meta_info)
        repeated = prompts.repeat(params.n, interleave=True) if params.n > 1 else prompts
        input_ids = repeated.batch["input_ids"].long()
        attention_mask = repeated.batch["attention_mask"].long()
        num_prompt_tokens = input_ids.shape[1]
        generator = self._generator(input_ids.device)
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for _ in range(params.response_length):
            next_tokens = sample_next_token(self._last_logits(input_ids, attention_mask), params, generator)
            next_tokens = next_tokens.masked_fill(finished, self.pad_token_id)
            input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
            attention_mask = torch.cat([attention_mask, (~finished).long()[:, None]], dim=-1)
            finished |= is_eos(next_tokens, self.eos_ids)
            if bool(finished.all()):
                break
        return build_rollout_output(
            repeated, input_ids[:, num_prompt_tokens:], params.response_length, self.pad_token_id, self.eos_ids
        )
