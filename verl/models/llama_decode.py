"""A lean decode step for Llama-family Hugging Face models (Llama, Mistral, Qwen2, Qwen3, Gemma), on their own weights.

A decode step feeds one token per row. ``transformers`` runs it through its module stack: per layer, three
projection calls for query, key and value, two for the MLP's gate and up, a mask built for the cache, and a dozen
small tensor operations around each; on a small model or a short batch that bookkeeping, not the arithmetic, sets
the speed. :class:`LlamaFamilyDecoder` keeps ``transformers`` for the prompt (the prefill, through
:class:`~verl.workers.rollout.decoding.HFCachedDecoder` and its preallocated cache) and runs each decode step as
one plain function over the same weights:

- on CPU, query, key and value come from one matrix product on the concatenated projection weights, and the MLP's
  gate and up from another; the concatenations are built at each generate call's prefill and dropped on release
  (two thirds to 70 % of the weights outside the embedding and the LM head, held for the call only). They are not
  kept between calls: training changes the weights before every call, and no cheap signal sees every change
  (torch's fused AdamW does not bump the parameters' version counters). On any other device (CUDA) nothing is
  concatenated: each projection is its own product on the layer's weight, so decoding takes no memory beyond the
  cache (a fused copy of a 7B model's fp32 weights would be about 18 GB);
- the grouped query heads attend as a ``[rows, key/value heads, group, head_dim]`` query against the cache, one
  fused attention call with no copy of the keys and values per query head;
- the rotary embedding comes from the model's own rotary module, once per step for all layers, so every rope
  variant the model supports is honoured;
- Gemma differs from Llama in three places, each taken from the model: its embedding module scales by the square
  root of the hidden size (the step calls that module), its RMSNorms scale by ``1 + weight`` (the step adds the 1,
  once per call, to each norm's weight), and its MLP's activation is the tanh-approximated GELU.

The step writes the new keys and values into the same cache layers the prefill filled, so row selection
(:meth:`keep_rows`) and release are the HF decoder's. It computes what the modules it bypasses would, and only
that: :func:`lean_decode_refusal` refuses any model where a bypassed module could do more (an adapter, quantised or
other replacement of a projection, a forward hook, another activation, sliding-window attention, sharded weights).
Such a model keeps the HF decoder, which runs every module as it is; a model that gains such a module after its
decoder was built is decoded by ``transformers`` from the next prefill on. The logits match the ``transformers``
forward pass to float rounding (tested).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.modules import module as torch_module

from verl.models.decoding import AutocastFactory, HFCachedDecoder
from verl.utils.cpu_linear import OneDNNLinear, onednn_linear

__all__ = ["LlamaFamilyDecoder", "lean_decode_refusal", "supports_llama_decode"]

logger = logging.getLogger(__name__)

# Model types whose decoder layer is: RMSNorm, attention (q/k/v/o projections, rotary embedding, optional per-head
# q/k RMSNorm), residual, RMSNorm, gated MLP, residual; each with the MLP activation its config must name, and
# whether its RMSNorm scales by (1 + weight) instead of weight.
FAMILY_ACTIVATION = {
    "llama": "silu",
    "mistral": "silu",
    "qwen2": "silu",
    "qwen3": "silu",
    "gemma": "gelu_pytorch_tanh",
}
NORM_ADDS_ONE = ("gemma",)
LLAMA_FAMILY = tuple(FAMILY_ACTIVATION)
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}

# The linear layer classes whose forward is ``F.linear(x, weight, bias)`` and nothing more (OneDNNLinear: the same
# product on oneDNN's kernels). Exact classes, not subclasses: a subclass (an adapter, a quantised layer) may have a
# forward of its own, which the lean step would skip.
PLAIN_LINEARS = (torch.nn.Linear, OneDNNLinear)

Product = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def supports_llama_decode(module: torch.nn.Module) -> bool:
    """Whether :class:`LlamaFamilyDecoder` can decode ``module`` (else the HF decoder runs it); see
    :func:`lean_decode_refusal`."""
    return lean_decode_refusal(module) is None


def lean_decode_refusal(module: torch.nn.Module) -> str | None:
    """Why :class:`LlamaFamilyDecoder` cannot decode ``module``, or None when it can.

    It needs a Llama-family model type with its family's activation (SiLU; Gemma's tanh GELU), full attention in
    every layer, plain (unsharded) parameters (an FSDP2-sharded model only gathers its weights inside its own forward
    pass), and every module whose
    forward the lean step replaces by its own arithmetic (the model, its layers, their attention and MLP, norms,
    projections, activation and the LM head) must be ``transformers``' own class, or a plain ``nn.Linear`` for a
    projection, with no forward hook or forward pre-hook, and no global module hook registered.
    """
    config = getattr(module, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in LLAMA_FAMILY:
        return f"model type {model_type!r} is not one of {LLAMA_FAMILY}"
    activation = getattr(config, "hidden_act", None)
    if activation != FAMILY_ACTIVATION[model_type]:
        return f"activation {activation!r} is not {FAMILY_ACTIVATION[model_type]}"
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    sliding = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
    if sliding or any(kind != "full_attention" for kind in layer_types):
        return "not every layer has full attention (sliding-window attention)"
    inner = getattr(module, "model", None)
    if inner is None or not all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "the module has no model.embed_tokens / layers / norm / rotary_emb"
    if not all(type(p) is torch.nn.Parameter or type(p) is torch.Tensor for p in module.parameters()):
        return "a parameter is not a plain tensor (a sharded model gathers its weights only in its own forward)"
    if getattr(torch_module, "_global_forward_hooks", None) or getattr(torch_module, "_global_forward_pre_hooks", None):
        return "a global module forward hook is registered (torch.nn.modules.module.register_module_forward_hook)"
    for name, child, kind in _bypassed_modules(module):
        refusal = _module_refusal(name, child, kind)
        if refusal is not None:
            return refusal
    return None


def _bypassed_modules(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module | None, str]]:
    """``(name, module, kind)`` of every module whose forward the lean step replaces by its own arithmetic; kind is
    ``linear`` (computed as ``F.linear`` on its weight), ``norm`` (RMSNorm on its weight) or ``block``. The embedding
    and the rotary module are left out: the step calls them, so their hooks run."""
    inner = module.model
    yield "", module, "block"
    yield "model", inner, "block"
    for index, layer in enumerate(inner.layers):
        prefix = f"model.layers.{index}"
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        yield prefix, layer, "block"
        yield f"{prefix}.self_attn", attn, "block"
        yield f"{prefix}.mlp", mlp, "block"
        if attn is None or mlp is None:
            return
        yield f"{prefix}.input_layernorm", getattr(layer, "input_layernorm", None), "norm"
        yield f"{prefix}.post_attention_layernorm", getattr(layer, "post_attention_layernorm", None), "norm"
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            yield f"{prefix}.self_attn.{name}", getattr(attn, name, None), "linear"
        for name in ("q_norm", "k_norm"):  # Qwen3 only
            if hasattr(attn, name):
                yield f"{prefix}.self_attn.{name}", getattr(attn, name), "norm"
        for name in ("gate_proj", "up_proj", "down_proj"):
            yield f"{prefix}.mlp.{name}", getattr(mlp, name, None), "linear"
        yield f"{prefix}.mlp.act_fn", getattr(mlp, "act_fn", None), "block"
    yield "model.norm", inner.norm, "norm"
    yield "lm_head", getattr(module, "lm_head", None), "linear"


def _module_refusal(name: str, child: torch.nn.Module | None, kind: str) -> str | None:
    label = name or "the model"
    if not isinstance(child, torch.nn.Module):
        return f"{label} is missing"
    if child._forward_hooks or child._forward_pre_hooks:
        return f"{label} has a forward hook or pre-hook, which the lean step would skip"
    if "forward" in vars(child):
        return f"{label} has a forward set on the instance, which the lean step would skip"
    cls = type(child)
    if kind == "linear":
        if cls not in PLAIN_LINEARS:
            return f"{label} is a {cls.__module__}.{cls.__qualname__}, not a plain nn.Linear (its forward may differ)"
    elif not cls.__module__.startswith("transformers."):
        return f"{label} is a {cls.__module__}.{cls.__qualname__}, not transformers' own (its forward may differ)"
    elif kind == "norm" and not isinstance(getattr(child, "weight", None), torch.Tensor):
        return f"{label} has no weight"
    return None


def _cat_biases(linears: tuple[torch.nn.Linear, ...]) -> torch.Tensor | None:
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


class _Projections:
    """Linear layers that read the same input: one product on their concatenated weights (``fuse``), or one
    product per layer on its own weight, read at each call (no copy)."""

    def __init__(self, linears: tuple[torch.nn.Linear, ...], fuse: bool):
        self.linears = linears
        self.sizes = [linear.out_features for linear in linears]
        # detached: the step runs without gradients, and a graph would keep every weight's history alive
        self.weight = torch.cat([linear.weight.detach() for linear in linears]) if fuse else None
        self.bias = _cat_biases(linears) if fuse else None
        if self.bias is not None:
            self.bias = self.bias.detach()

    def __call__(self, product: Product, inputs: torch.Tensor) -> list[torch.Tensor]:
        """Each layer's output, ``(rows, out_features)`` per layer."""
        if self.weight is not None:
            return list(product(inputs, self.weight, self.bias).split(self.sizes, dim=-1))
        return [product(inputs, linear.weight, linear.bias) for linear in self.linears]

    def num_fused_bytes(self) -> int:
        """Bytes this object holds beyond the model's own weights (the concatenations)."""
        return sum(t.numel() * t.element_size() for t in (self.weight, self.bias) if t is not None)


@dataclass
class _LayerWeights:
    """One decoder layer's modules, with the projections that share an input grouped."""

    input_norm: torch.nn.Module
    qkv: _Projections
    q_norm: torch.nn.Module | None
    k_norm: torch.nn.Module | None
    out: torch.nn.Linear
    post_norm: torch.nn.Module
    gate_up: _Projections
    down: torch.nn.Linear


def _layer_weights(layer: torch.nn.Module, fuse: bool) -> _LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    return _LayerWeights(
        input_norm=layer.input_layernorm,
        qkv=_Projections((attn.q_proj, attn.k_proj, attn.v_proj), fuse),
        q_norm=getattr(attn, "q_norm", None),
        k_norm=getattr(attn, "k_norm", None),
        out=attn.o_proj,
        post_norm=layer.post_attention_layernorm,
        gate_up=_Projections((mlp.gate_proj, mlp.up_proj), fuse),
        down=mlp.down_proj,
    )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class LlamaFamilyDecoder(HFCachedDecoder):
    """The HF decoder's prefill and cache, with each decode step run as one function over the model's weights.

    Args:
        module: a model for which :func:`supports_llama_decode` holds.
        autocast: a factory of the context each forward pass runs in (the actor's mixed precision).
        fuse_projections: run query/key/value and gate/up as one product each on concatenated weights, built at
            each prefill and dropped on release; None (the default) fuses on CPU only (see the module docstring).

    Raises:
        ValueError: ``module`` is not one the lean step can decode; the message says why.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        autocast: AutocastFactory = contextlib.nullcontext,
        fuse_projections: bool | None = None,
    ):
        refusal = lean_decode_refusal(module)
        if refusal is not None:
            raise ValueError(
                f"LlamaFamilyDecoder cannot decode {type(module).__name__}: {refusal}; use HFCachedDecoder "
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
        self.fuse_projections = fuse_projections
        self._activation = ACTIVATIONS[config.hidden_act]
        self._norm_adds_one = config.model_type in NORM_ADDS_ONE
        # each RMSNorm's scale for this call: its weight, or 1 + weight (Gemma), built at the prefill
        self._norm_scales: dict[torch.nn.Module, torch.Tensor] = {}
        # None between calls, and during a call whose model the lean step refused at its prefill
        self._layers: list[_LayerWeights] | None = None
        self._refusal: str | None = None
        # the products run on the kernels the model's own layers use (see verl.utils.cpu_linear)
        self._linear: Product = onednn_linear if isinstance(module.lm_head, OneDNNLinear) else F.linear

    def prefill(self, input_ids, attention_mask, position_ids, max_new_tokens):
        # checked at every call: an adapter or a hook may have been added to the model since the last one
        refusal = lean_decode_refusal(self.module)
        if refusal is not None and refusal != self._refusal:
            logger.warning("The lean decode step is off for this model (%s); transformers decodes it.", refusal)
        self._refusal = refusal
        if refusal is None:
            fuse = self.fuse_projections
            if fuse is None:
                fuse = self.module.lm_head.weight.device.type == "cpu"
            # the weights of this call (training changed them since the last one), fused once for all its steps
            self._layers = [_layer_weights(layer, fuse) for layer in self.module.model.layers]
            if self._norm_adds_one:
                norms = [m for _, m, kind in _bypassed_modules(self.module) if kind == "norm"]
                self._norm_scales = {norm: 1.0 + norm.weight.detach() for norm in norms}
        return super().prefill(input_ids, attention_mask, position_ids, max_new_tokens)

    def release(self):
        self._layers = None
        self._norm_scales = {}
        super().release()

    def num_fused_bytes(self) -> int:
        """Bytes the current call's concatenated weights hold beyond the model's own (0 between calls)."""
        layers = self._layers or []
        return sum(w.qkv.num_fused_bytes() + w.gate_up.num_fused_bytes() for w in layers)

    @torch.no_grad()
    def decode(self, tokens, attention_mask, position_ids):
        if self._layers is None:  # refused at this call's prefill: transformers' modules, hooks and all
            return super().decode(tokens, attention_mask, position_ids)
        model = self.module.model
        with self.autocast():
            hidden = model.embed_tokens(tokens)  # (B, H)
            cos, sin = model.rotary_emb(hidden, position_ids[:, None])  # (B, 1, D): broadcast over heads
            attend = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, L): the cache's real columns
            for weights, cache in zip(self._layers, self._cache.layers, strict=True):
                hidden = self._layer(hidden, weights, cache, cos, sin, attend)
            hidden = self._rms_norm(hidden, model.norm)
            head = self.module.lm_head
            return self._linear(hidden, head.weight, head.bias).float()  # float32, as every decoder returns

    def _rms_norm(self, hidden: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", self.eps))  # transformers' RMSNorm keeps its own
        scale = self._norm_scales.get(norm, norm.weight)
        return F.rms_norm(hidden, (hidden.shape[-1],), scale, eps)

    def _layer(self, hidden, weights: _LayerWeights, cache, cos, sin, attend) -> torch.Tensor:
        rows, head_dim, kv_heads = hidden.shape[0], self.head_dim, self.num_kv_heads
        query, key, value = weights.qkv(self._linear, self._rms_norm(hidden, weights.input_norm))
        query = query.reshape(rows, self.num_heads, head_dim)
        key = key.reshape(rows, kv_heads, head_dim)
        if weights.q_norm is not None:  # Qwen3: RMSNorm over each head before the rotary embedding
            query = self._rms_norm(query, weights.q_norm)
            key = self._rms_norm(key, weights.k_norm)
        query = query * cos + _rotate_half(query) * sin
        key = key * cos + _rotate_half(key) * sin
        keys, values = cache.update(key[:, :, None], value.reshape(rows, kv_heads, 1, head_dim))
        # the query heads that share a key/value head ride as that head's "sequence" of queries
        attended = F.scaled_dot_product_attention(
            query.view(rows, kv_heads, self.group, head_dim).to(keys.dtype),
            keys,
            values,
            attn_mask=attend,
            scale=self.scaling,
        )
        out = weights.out
        hidden = hidden + self._linear(attended.reshape(rows, -1), out.weight, out.bias)
        gate, up = weights.gate_up(self._linear, self._rms_norm(hidden, weights.post_norm))
        down = weights.down
        return hidden + self._linear(self._activation(gate) * up, down.weight, down.bias)
