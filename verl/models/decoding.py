"""Incremental decoders: a model's forward pass one token at a time, for the ``naive`` rollout's sampling loop.

The naive rollout owns sampling, stopping and the output layout; a decoder owns how the model is run. Its whole
contract is three calls on the rows still generating:

- :meth:`IncrementalDecoder.prefill`: the prompts (B, P), left-padded; returns the last position's logits (B, V).
- :meth:`IncrementalDecoder.decode`: one new token per row with the mask and position of that token; returns its
  logits (B, V).
- :meth:`IncrementalDecoder.keep_rows`: only these rows go on (finished rows leave the batch, so a step's cost
  follows the rows still generating).

:class:`HFCachedDecoder` runs a Hugging Face causal LM on its own key/value cache, preallocated for the call
(:class:`PreallocatedCacheLayer`: written in place, no per-token concatenation). The megatron-core decoder lives
with the megatron model code (``verl.models.mcore.inference``). :class:`RecomputeDecoder` serves any
``logits_fn(input_ids, attention_mask, position_ids)`` by re-running the whole sequence each token: the reference
the cached decoders are tested against, and the path for models with no cache of their own. This module lives in
:mod:`verl.models`, below the rollout engines and the actor that both decode with it
(``verl.workers.rollout.decoding`` re-exports it).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from transformers import AttentionInterface, Cache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = [
    "HFCachedDecoder",
    "IncrementalDecoder",
    "LogitsFn",
    "PreallocatedCacheLayer",
    "RecomputeDecoder",
    "last_logits",
]

LogitsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
AutocastFactory = Callable[[], contextlib.AbstractContextManager]


# The attention the HF decoder switches an ``sdpa`` model to while it decodes (see grouped_query_sdpa_attention).
GROUPED_QUERY_SDPA = "verl_grouped_query_sdpa"


def grouped_query_sdpa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' ``sdpa`` attention, minus its key/value copy on CPU.

    With grouped-query attention and a padding mask, transformers repeats the cached keys and values to one copy per
    query head before calling SDPA: in a decode step that copies the whole cache, every layer, every token (measured
    on 2 CPU cores, 64 rows of 70 tokens, 6 query and 2 key/value heads: 1050 us per layer call against 177 us with
    SDPA's own ``enable_gqa``). On CPU this passes the grouped keys as they are; elsewhere (CUDA, whose fast kernels
    take no mask together with ``enable_gqa``) it is transformers' own function.
    """
    groups = getattr(module, "num_key_value_groups", 1)
    if query.device.type != "cpu" or groups == 1 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if attention_mask is not None and attention_mask.dim() == 4:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    is_causal = query.shape[2] > 1 and attention_mask is None and getattr(module, "is_causal", True)
    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=is_causal,
        enable_gqa=True,
    )
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_QUERY_SDPA, grouped_query_sdpa_attention)
AttentionMaskInterface.register(GROUPED_QUERY_SDPA, sdpa_mask)


def last_logits(output: Any, batch_size: int, seq_len: int | None = None) -> torch.Tensor:
    """The last position's logits (B, V) in float32 from a model output (a tensor or a ``ModelOutput``).

    Args:
        output: (B, S, V) logits, or an object holding them in ``.logits``.
        batch_size: the B the caller fed.
        seq_len: the S the output must have, when every position's logits are expected; None accepts any.

    Raises:
        ValueError: the output is not (B, S, V) logits of that shape; the message says the shape expected.
    """
    logits = getattr(output, "logits", output)
    expected = (batch_size,) if seq_len is None else (batch_size, seq_len)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[: len(expected)] != expected:
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        wanted = f"(B, S, V) with B = {batch_size}" if seq_len is None else f"(B, S, V) = {expected} + (V,)"
        raise ValueError(f"the model must return logits of shape {wanted}, got {shape}.")
    return logits[:, -1, :].float()


class IncrementalDecoder(ABC):
    """One generate call's incremental forward pass (a fresh cache per :meth:`prefill`)."""

    @abstractmethod
    def prefill(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, max_new_tokens: int
    ) -> torch.Tensor:
        """Run the prompts and start a cache with room for ``max_new_tokens`` more tokens per row.

        Args:
            input_ids, attention_mask, position_ids: (B, P) int64, prompts left-padded.
            max_new_tokens: the most tokens :meth:`decode` will be called with after this.

        Returns:
            (B, V) float32 logits of each row's last prompt token.
        """

    @abstractmethod
    def decode(self, tokens: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Append one token per row and return its logits.

        Args:
            tokens: (B,) the rows' newest tokens.
            attention_mask: (B, P + t) the rows' whole mask, this token's column (1) included.
            position_ids: (B,) this token's position in each row.

        Returns:
            (B, V) float32 logits.
        """

    @abstractmethod
    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (int64 indices into the current rows, ascending) for the following calls."""

    def release(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Drop the cache once the call is over (the decoder is reused by the next call)."""


class RecomputeDecoder(IncrementalDecoder):
    """No cache: every call re-runs ``logits_fn`` on the whole sequence so far (quadratic in the length).

    Args:
        logits_fn: ``(input_ids, attention_mask, position_ids) -> (B, S, V)`` logits, or a ``ModelOutput``
            holding them.
    """

    def __init__(self, logits_fn: LogitsFn):
        if not callable(logits_fn):
            raise ValueError(f"RecomputeDecoder needs a callable logits_fn, got {type(logits_fn).__name__}.")
        self.logits_fn = logits_fn
        self._input_ids: torch.Tensor | None = None
        self._position_ids: torch.Tensor | None = None

    def _run(self, attention_mask: torch.Tensor) -> torch.Tensor:
        output = self.logits_fn(self._input_ids, attention_mask, self._position_ids)
        return last_logits(output, *self._input_ids.shape)

    def prefill(self, input_ids, attention_mask, position_ids, max_new_tokens):
        self._input_ids, self._position_ids = input_ids, position_ids
        return self._run(attention_mask)

    def decode(self, tokens, attention_mask, position_ids):
        self._input_ids = torch.cat([self._input_ids, tokens[:, None]], dim=-1)
        self._position_ids = torch.cat([self._position_ids, position_ids[:, None]], dim=-1)
        return self._run(attention_mask)

    def keep_rows(self, rows):
        self._input_ids = self._input_ids[rows]
        self._position_ids = self._position_ids[rows]

    def release(self):
        self._input_ids = self._position_ids = None


class PreallocatedCacheLayer(DynamicLayer):
    """One attention layer's key/value cache, allocated once per generate call.

    ``transformers``' own dynamic layer concatenates every new token onto the whole cache (a copy of the cache
    per token and layer); this one allocates ``[B, heads, P + max_new_tokens, head_dim]`` at the first update
    and writes each new token in place, handing the model a view of the filled part. It is a ``DynamicLayer``
    to ``transformers`` (that is how a ``Cache`` recognises a full-attention layer) and overrides every call
    that touches the tensors.
    """

    is_croppable = False

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = int(capacity)
        self.length = 0
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads = key_states.shape[:2]
        self._key_buffer = key_states.new_empty(batch, heads, self.capacity, key_states.shape[-1])
        self._value_buffer = value_states.new_empty(batch, heads, self.capacity, value_states.shape[-1])
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise ValueError(f"the key/value cache holds {self.capacity} tokens per row; {end} were asked for.")
        self._key_buffer[:, :, self.length : end] = key_states
        self._value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self.keys = self._key_buffer[:, :, :end]
        self.values = self._value_buffer[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self, *args, **kwargs) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if not self.is_initialized:
            return
        self._key_buffer = self._key_buffer[indices]
        self._value_buffer = self._value_buffer[indices]
        self.keys = self._key_buffer[:, :, : self.length]
        self.values = self._value_buffer[:, :, : self.length]

    def reset(self) -> None:
        self.length = 0
        self.is_initialized = False
        self.keys = self.values = self._key_buffer = self._value_buffer = None


class HFCachedDecoder(IncrementalDecoder):
    """A ``transformers`` causal LM on a preallocated key/value cache layer per attention layer.

    Args:
        module: the model (any ``PreTrainedModel`` with a full-attention decoder), possibly sharded (FSDP2: every
            forward pass gathers its parameters, so all ranks must call as often; the rollout sees to it).
        autocast: a factory of the context each forward pass runs in (the actor's mixed precision).
    """

    def __init__(self, module: torch.nn.Module, autocast: AutocastFactory = contextlib.nullcontext):
        self.module = module
        self.autocast = autocast
        self.num_layers = int(module.config.get_text_config().num_hidden_layers)
        self._cache = None
        self._restore_attention: str | None = None

    def _forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        with self.autocast():
            output = self.module(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=self._cache,
                use_cache=True,
                logits_to_keep=1,
            )
        return last_logits(output, input_ids.shape[0])

    def prefill(self, input_ids, attention_mask, position_ids, max_new_tokens):
        capacity = input_ids.shape[1] + max_new_tokens
        self._cache = Cache(layers=[PreallocatedCacheLayer(capacity) for _ in range(self.num_layers)])
        config = self.module.config
        if config._attn_implementation == "sdpa":  # decode without the per-token key/value copy (until release)
            self._restore_attention = config._attn_implementation
            config._attn_implementation = GROUPED_QUERY_SDPA
        return self._forward(input_ids, attention_mask, position_ids)

    def decode(self, tokens, attention_mask, position_ids):
        return self._forward(tokens[:, None], attention_mask, position_ids[:, None])

    def keep_rows(self, rows):
        for layer in self._cache.layers:
            layer.batch_select_indices(rows)

    def release(self):
        self._cache = None
        if self._restore_attention is not None:
            self.module.config._attn_implementation = self._restore_attention
            self._restore_attention = None
