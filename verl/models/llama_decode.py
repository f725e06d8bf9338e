"""A lean decode step for Llama-family Hugging Face models (Llama, Mistral, Qwen2, Qwen3), on their own weights.

A decode step feeds one token per row. ``transformers`` runs it through its module stack: per layer, three
projection calls for query, key and value, two for the MLP's gate and up, a mask built for the cache, and a dozen
small tensor operations around each; on a small model or a short batch that bookkeeping, not the arithmetic, sets
the speed. :class:`LlamaFamilyDecoder` keeps ``transformers`` for the prompt (the prefill, through
:class:`~verl.workers.rollout.decoding.HFCachedDecoder` and its preallocated cache) and runs each decode step as
one plain function over the same weights:

- query, key and value come from one matrix product on the concatenated projection weights, and the MLP's gate and
  up from another (the concatenations are built once per generate call, since training changes the weights
  between calls, and dropped on release);
- the grouped query heads attend as a ``[rows, key/value heads, group, head_dim]`` query against the cache, one
  fused attention call with no copy of the keys and values per query head;
- the rotary embedding comes from the model's own rotary module, once per step for all layers, so every rope
  variant the model supports is honoured.

The step writes the new keys and values into the same cache layers the prefill filled, so row selection
(:meth:`keep_rows`) and release are the HF decoder's. :func:`supports_llama_decode` says which models qualify;
anything else (sliding-window attention, another activation, a sharded model whose weights a plain function
cannot read) keeps the HF decoder. The logits match the ``transformers`` forward pass to float rounding (tested).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verl.utils.cpu_linear import OneDNNLinear, onednn_linear
from verl.workers.rollout.decoding import AutocastFactory, HFCachedDecoder

__all__ = ["LlamaFamilyDecoder", "supports_llama_decode"]

# Model types whose decoder layer is: RMSNorm, attention (q/k/v/o projections, rotary embedding, optional per-head
# q/k RMSNorm), residual, RMSNorm, gated SiLU MLP, residual.
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")


def supports_llama_decode(module: torch.nn.Module) -> bool:
    """Whether :class:`LlamaFamilyDecoder` can decode ``module`` (else the HF decoder runs it).

    It needs a Llama-family model type, SiLU activation, full attention in every layer, and plain (unsharded)
    parameters: an FSDP2-sharded model only gathers its weights inside its own forward pass.
    """
    config = getattr(module, "config", None)
    if config is None or getattr(config, "model_type", None) not in LLAMA_FAMILY:
        return False
    if getattr(config, "hidden_act", None) != "silu":
        return False
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(kind != "full_attention" for kind in layer_types):
        return False
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return False
    inner = getattr(module, "model", None)
    if inner is None or not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    return all(type(p) is torch.nn.Parameter or type(p) is torch.Tensor for p in module.parameters())


@dataclass
class _LayerWeights:
    """One decoder layer's weights, with the projections that share an input concatenated."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    out: torch.Tensor
    out_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


def _cat_biases(*linears: torch.nn.Linear) -> torch.Tensor | None:
    biases = [linear.bias for linear in linears]
    if all(bias is None for bias in biases):
        return None
    # where only some of the fused projections have a bias, zeros stand in for the missing ones
    return torch.cat(
        [
            bias if bias is not None else linear.weight.new_zeros(linear.out_features)
            for bias, linear in zip(biases, linears)
        ]
    )


def _layer_weights(layer: torch.nn.Module) -> _LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    return _LayerWeights(
        input_norm=layer.input_layernorm.weight,
        qkv=torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
        qkv_bias=_cat_biases(attn.q_proj, attn.k_proj, attn.v_proj),
        q_norm=None if q_norm is None else q_norm.weight,
        k_norm=None if k_norm is None else k_norm.weight,
        out=attn.o_proj.weight,
        out_bias=attn.o_proj.bias,
        post_norm=layer.post_attention_layernorm.weight,
        gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
        gate_up_bias=_cat_biases(mlp.gate_proj, mlp.up_proj),
        down=mlp.down_proj.weight,
        down_bias=mlp.down_proj.bias,
    )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class LlamaFamilyDecoder(HFCachedDecoder):
    """The HF decoder's prefill and cache, with each decode step run as one function over fused weights.

    Args:
        module: a model for which :func:`supports_llama_decode` holds.
        autocast: a factory of the context each forward pass runs in (the actor's mixed precision).
    """

    def __init__(self, module: torch.nn.Module, autocast: AutocastFactory = contextlib.nullcontext):
        if not supports_llama_decode(module):
            raise ValueError(
                f"LlamaFamilyDecoder cannot decode {type(module).__name__}; use HFCachedDecoder "
                "(see supports_llama_decode)."
            )
        super().__init__(module, autocast)
        config = module.config
        self.hidden_size = int(config.hidden_size)
        self.eps = float(config.rms_norm_eps)
        first = module.model.layers[0].self_attn
        self.head_dim = int(first.head_dim)
        self.scaling = float(first.scaling)
        self.num_kv_heads = int(config.num_key_value_heads)
        self.num_heads = int(config.num_attention_heads)
        self.group = self.num_heads // self.num_kv_heads
        self._layers: list[_LayerWeights] | None = None
        # the products run on the kernels the model's own layers use (see verl.utils.cpu_linear)
        self._linear = onednn_linear if isinstance(module.lm_head, OneDNNLinear) else F.linear

    def prefill(self, input_ids, attention_mask, position_ids, max_new_tokens):
        # the weights of this call (training changed them since the last one), fused once for all its steps
        self._layers = [_layer_weights(layer) for layer in self.module.model.layers]
        return super().prefill(input_ids, attention_mask, position_ids, max_new_tokens)

    def release(self):
        self._layers = None
        super().release()

    @torch.no_grad()
    def decode(self, tokens, attention_mask, position_ids):
        model = self.module.model
        with self.autocast():
            hidden = model.embed_tokens(tokens)  # (B, H)
            cos, sin = model.rotary_emb(hidden, position_ids[:, None])  # (B, 1, D): broadcast over heads
            attend = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, L): the cache's real columns
            for weights, cache in zip(self._layers, self._cache.layers):
                hidden = self._layer(hidden, weights, cache, cos, sin, attend)
            hidden = F.rms_norm(hidden, (self.hidden_size,), model.norm.weight, self.eps)
            head = self.module.lm_head
            return self._linear(hidden, head.weight, head.bias).float()  # float32, as every decoder returns

    def _layer(self, hidden, weights: _LayerWeights, cache, cos, sin, attend) -> torch.Tensor:
        rows, head_dim, kv_heads = hidden.shape[0], self.head_dim, self.num_kv_heads
        normed = F.rms_norm(hidden, (self.hidden_size,), weights.input_norm, self.eps)
        qkv = self._linear(normed, weights.qkv, weights.qkv_bias)
        query, key, value = qkv.split([self.num_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        query = query.view(rows, self.num_heads, head_dim)
        key = key.view(rows, kv_heads, head_dim)
        if weights.q_norm is not None:  # Qwen3: RMSNorm over each head before the rotary embedding
            query = F.rms_norm(query, (head_dim,), weights.q_norm, self.eps)
            key = F.rms_norm(key, (head_dim,), weights.k_norm, self.eps)
        query = query * cos + _rotate_half(query) * sin
        key = key * cos + _rotate_half(key) * sin
        keys, values = cache.update(key[:, :, None], value.view(rows, kv_heads, 1, head_dim))
        # the query heads that share a key/value head ride as that head's "sequence" of queries
        attended = F.scaled_dot_product_attention(
            query.view(rows, kv_heads, self.group, head_dim).to(keys.dtype),
            keys,
            values,
            attn_mask=attend,
            scale=self.scaling,
        )
        hidden = hidden + self._linear(attended.reshape(rows, -1), weights.out, weights.out_bias)
        normed = F.rms_norm(hidden, (self.hidden_size,), weights.post_norm, self.eps)
        gate, up = self._linear(normed, weights.gate_up, weights.gate_up_bias).chunk(2, dim=-1)
        return hidden + self._linear(F.silu(gate) * up, weights.down, weights.down_bias)
