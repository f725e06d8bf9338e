"""KV-cached incremental decoding of a megatron-core ``GPTModel``, on megatron-core's own static inference context.

``MegatronCachedDecoder`` is the megatron side of the naive rollout's decoder contract
(:class:`~verl.workers.rollout.decoding.IncrementalDecoder`). megatron-core's ``StaticInferenceContext`` keeps one
key/value buffer per layer (``[max_sequence, max_batch, query_groups, head_dim]``); its attention writes each
forward pass's keys and values at the context's sequence offset and attends over everything before it. Two things
are ours:

- the buffers are allocated here, on the model's device, before the first forward pass (megatron-core allocates
  missing ones on ``torch.cuda.current_device()``, which does not exist on CPU);
- finished rows leave the batch: every layer's buffers are cut down to the rows still generating.

Pipeline stages: each stage caches the keys and values of its own layers; every forward pass is relayed through
the stages (:func:`~verl.models.mcore.pipeline.stage_forward`) and the last stage's logits reach every stage, so
that all of them sample the same tokens.

Padding: megatron's RoPE rotates by sequence index (see ``verl.models.mcore.model``), and a left-padded row's real
tokens are contiguous, so cached keys keep their relative positions; the prompt's pad keys stay masked by the
boolean mask handed to every decode step (megatron's attention drops the causal mask type after the prefill; the
portable core attention applies the mask it is given whatever the type, and the Transformer Engine spec's is made
to, :func:`verl.models.mcore.layer_spec.get_layer_spec`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from megatron.core.inference.contexts import StaticInferenceContext

from verl.models.decoding import IncrementalDecoder, last_logits
from verl.models.mcore.model import build_attention_mask, unwrap_model
from verl.models.mcore.pipeline import PipelineStage, broadcast_from_last_stage, stage_forward

__all__ = ["MegatronCachedDecoder"]


class MegatronCachedDecoder(IncrementalDecoder):
    """A megatron-core ``GPTModel`` (the whole model, or this rank's pipeline stage) decoding on a static inference
    context.

    Args:
        model: a GPTModel from ``build_gpt_model``, possibly wrapped (megatron DDP, Float16Module).
        kv_dtype: dtype of the cached keys and values: the dtype the attention computes them in (the parameters'
            dtype, or the autocast dtype when the forward runs under autocast).
        autocast: a factory of the context each forward pass runs in.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        kv_dtype: torch.dtype,
        autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ):
        inner = unwrap_model(model)
        self.stage = PipelineStage.of_model(inner)
        self.vocab_size = inner.vocab_size
        self.model = model
        self.kv_dtype = kv_dtype
        self.autocast = autocast
        self._attentions = [layer.self_attention for layer in inner.decoder.layers]
        self._context: StaticInferenceContext | None = None

    def _allocate(self, batch: int, max_length: int, device: torch.device) -> StaticInferenceContext:
        context = StaticInferenceContext(max_batch_size=batch, max_sequence_length=max_length)
        for attention in self._attentions:
            groups = attention.num_query_groups_per_partition
            context.key_value_memory_dict[attention.layer_number] = (
                torch.empty(max_length, batch, groups, attention.key_hidden_size, dtype=self.kv_dtype, device=device),
                torch.empty(max_length, batch, groups, attention.val_hidden_size, dtype=self.kv_dtype, device=device),
            )
        return context

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if unwrap_model(self.model).training:  # the worker switches the inner model; a DDP wrapper stays in train()
            raise RuntimeError("cached decoding needs the model in eval mode (megatron caches only in inference)")
        inputs = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "attention_mask": mask,
            "inference_context": self._context,
            "runtime_gather_output": True,
        }
        rows = input_ids.shape[0]
        with self.autocast():
            if self.stage is None:
                logits = last_logits(self.model(**inputs), rows)
            else:
                _, output = stage_forward(self.model, self.stage, **inputs)
                mine = [last_logits(output, rows) if self.stage.is_last else None]
                logits = broadcast_from_last_stage(
                    self.stage, mine, [(rows, self.vocab_size)], torch.float32, input_ids.device
                )[0]
        self._context.sequence_len_offset += input_ids.shape[1]
        return logits

    def prefill(self, input_ids, attention_mask, position_ids, max_new_tokens):
        self._context = self._allocate(input_ids.shape[0], input_ids.shape[1] + max_new_tokens, input_ids.device)
        return self._forward(input_ids, position_ids, build_attention_mask(attention_mask))

    def decode(self, tokens, attention_mask, position_ids):
        # one query per row over every cached key: True = masked out (the prompt's padding)
        mask = ~attention_mask.bool()[:, None, None, :]
        return self._forward(tokens[:, None], position_ids[:, None], mask)

    def keep_rows(self, rows):
        memory = self._context.key_value_memory_dict
        for layer_number, (keys, values) in memory.items():
            memory[layer_number] = (keys[:, rows], values[:, rows])

    def release(self):
        self._context = None
