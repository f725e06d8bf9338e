"""Layer specs for megatron-core's GPTModel, including a portable (CPU-capable) variant.

megatron-core 0.16 has two CUDA-bound pieces on the path of a plain GPT forward: its local core attention
(``DotProductAttention`` takes its score buffer from a global memory buffer on ``torch.cuda.current_device()``
and forks the CUDA RNG tracker for dropout) and ``RotaryEmbedding.get_emb`` (it moves ``inv_freq`` to CUDA on
first use). The portable spec swaps in ``SDPACoreAttention`` — ``torch.nn.functional.scaled_dot_product_attention``
honouring megatron's boolean mask (True = masked out) and grouped-query attention — and ``PortableRotaryEmbedding``
keeps its frequencies on whatever device the module was moved to. Both are ordinary modules handed to megatron
through its spec/constructor arguments; megatron-core itself is not modified. With tensor parallelism a third
piece is CUDA-bound: the output layer's logits gather (``runtime_gather_output``) allocates on the current CUDA
device; ``PortableOutputLayer`` gathers the vocabulary slices with a device-agnostic all-gather instead.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.models.common.embeddings.rotary_pos_embedding import (
    RotaryEmbedding,
    get_pos_emb_on_this_cp_rank,
)
from megatron.core.models.gpt import gpt_layer_specs
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel import ColumnParallelLinear
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide

SPEC_BACKENDS = ("portable", "local", "te")

_CAUSAL_TYPES = (AttnMaskType.causal, AttnMaskType.padding_causal)


class SDPACoreAttention(MegatronModule):
    """Core attention on ``scaled_dot_product_attention``, a drop-in for megatron's ``DotProductAttention``.

    Takes megatron's layouts: query ``[sq, b, np, hn]``, key/value ``[sk, b, ng, hn]`` (``ng`` query groups, each
    shared by ``np // ng`` consecutive query heads) and returns ``[sq, b, np * hn]``. ``attention_mask`` is a bool
    tensor broadcastable to ``[b, np, sq, sk]`` with True where attention is NOT allowed; with a causal mask type
    the causal (bottom-right aligned) constraint is applied on top of it, so a padding-only mask also works.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPACoreAttention does not support context parallelism; set context_parallel_size=1")
        if config.softmax_type != "vanilla":
            raise ValueError(f"SDPACoreAttention supports softmax_type='vanilla' only, got {config.softmax_type!r}")
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp_size = pg_collection.tp.size()
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.num_heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.num_groups_per_partition = divide(config.num_query_groups, tp_size)
        head_dim = config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        # apply_query_key_layer_scaling needs no handling: megatron divides the scale by the layer number only to
        # multiply it back inside its fp32 softmax, so the net scale is the plain one used here.
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def _allowed_mask(self, attention_mask: torch.Tensor | None, sq: int, sk: int, device: torch.device) -> Any:
        """Bool mask with True = may attend, or None when SDPA's own ``is_causal`` suffices."""
        causal = self.attn_mask_type in _CAUSAL_TYPES and sq > 1
        if attention_mask is None and not causal:
            return None
        if attention_mask is None and sq == sk:
            return None  # is_causal path
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=device)
        if causal:
            # bottom-right alignment: query i sees keys up to i + (sk - sq), as with a KV cache
            allowed = torch.tril(allowed, diagonal=sk - sq)
        if attention_mask is not None:
            allowed = allowed & ~attention_mask.to(device=device, dtype=torch.bool)
        return allowed

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        """Attention over megatron's ``[s, b, heads, head_dim]`` tensors.

        Args:
            query: ``[sq, b, np, hn]``.
            key: ``[sk, b, ng, hn]``.
            value: ``[sk, b, ng, hn]``.
            attention_mask: bool, broadcastable to ``[b, np, sq, sk]``, True = masked out; or None.
            attn_mask_type: unused (the type given at construction decides causality, as in megatron).
            attention_bias: must be None.
            packed_seq_params: must be None (packed sequences need TE).

        Returns:
            Context ``[sq, b, np * hn]``.
        """
        if attention_bias is not None or packed_seq_params is not None:
            raise ValueError("SDPACoreAttention supports neither attention_bias nor packed sequences")
        sq, batch, num_heads, head_dim = query.shape
        sk = key.shape[0]
        num_repeats = self.num_heads_per_partition // self.num_groups_per_partition
        # [s, b, h, d] -> [b, h, s, d]
        q = query.permute(1, 2, 0, 3)
        k = key.permute(1, 2, 0, 3)
        v = value.permute(1, 2, 0, 3)
        if num_repeats > 1:
            # query heads g*r .. g*r+r-1 share group g, matching megatron's fused QKV grouping
            k = k.repeat_interleave(num_repeats, dim=1)
            v = v.repeat_interleave(num_repeats, dim=1)
        allowed = self._allowed_mask(attention_mask, sq, sk, query.device)
        is_causal = allowed is None and self.attn_mask_type in _CAUSAL_TYPES and sq > 1
        context = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=allowed,
            dropout_p=self.dropout_p if self.training else 0.0,
            is_causal=is_causal,
            scale=self.softmax_scale,
        )
        # [b, np, sq, hn] -> [sq, b, np * hn]
        return context.permute(2, 0, 1, 3).reshape(sq, batch, num_heads * head_dim)


class PortableRotaryEmbedding(RotaryEmbedding):
    """megatron's RotaryEmbedding with its frequencies kept as a buffer that follows the module's device.

    The stock ``get_emb`` moves ``inv_freq`` to CUDA on first call; here ``inv_freq`` is a non-persistent buffer
    (so ``model.to(device)`` moves it and checkpoints never see it), kept in float32 even if the module is cast
    to half precision, and the result is not memoised across devices.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["use_cpu_initialization"] = True
        super().__init__(*args, **kwargs)
        inv_freq = self.inv_freq
        del self.inv_freq
        self._inv_freq_fp32 = inv_freq.float().clone()
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def _apply(self, fn: Any, recurse: bool = True) -> PortableRotaryEmbedding:
        super()._apply(fn, recurse)
        # a .half() of the whole model must not round the frequencies; keep fp32 on the new device
        self.inv_freq = self._inv_freq_fp32.to(self.inv_freq.device)
        return self

    def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        """RoPE angles ``[max_seq_len, 1, 1, dim]`` on ``inv_freq``'s device (no move to CUDA)."""
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        if not self.rotary_interleaved:
            emb = torch.cat((freqs, freqs), dim=-1)
        else:
            emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
        return emb[:, None, None, :]

    def forward(
        self,
        max_seq_len: int,
        offset: int = 0,
        packed_seq: bool = False,
        cp_group: torch.distributed.ProcessGroup | None = None,
    ) -> torch.Tensor:
        """RoPE angles for positions ``offset .. offset + max_seq_len - 1``, sliced for context parallelism.

        Args:
            max_seq_len: number of positions.
            offset: first position.
            packed_seq: True for THD-packed input (then no context-parallel slicing here).
            cp_group: context-parallel group; defaults to the one given at construction.

        Returns:
            ``[max_seq_len (/ cp), 1, 1, dim]`` float32 angles.
        """
        emb = self.get_emb(max_seq_len, offset)
        cp_group = self.cp_group if cp_group is None else cp_group
        if cp_group is not None and cp_group.size() > 1 and not packed_seq:
            emb = get_pos_emb_on_this_cp_rank(emb, 0, cp_group)
        return emb


class PortableOutputLayer(ColumnParallelLinear):
    """megatron's vocabulary-parallel output layer, gathering the vocabulary slices on any device.

    The GPTModel's own output layer is turned into this class after construction (same parameters, same
    forward), because megatron passes ``runtime_gather_output`` to it and its gather allocates on CUDA. Without
    tensor parallelism there is nothing to gather and it behaves exactly as the stock layer.
    """

    def forward(self, input_: torch.Tensor, weight: torch.Tensor | None = None, runtime_gather_output=None):
        """(logits, bias) as the stock layer returns them, over the whole vocabulary when gathering is asked."""
        from verl.models.mcore.tensor_parallel import gather_vocab_parallel_logits

        gather = self.gather_output if runtime_gather_output is None else runtime_gather_output
        output, bias = super().forward(input_, weight=weight, runtime_gather_output=False)
        return (gather_vocab_parallel_logits(output) if gather else output), bias


def resolve_spec_backend(backend: str, device: torch.device) -> str:
    """Pick the layer-spec backend: ``auto`` is ``portable`` off CUDA, else ``te`` if installed, else ``local``."""
    if backend == "auto":
        if device.type != "cuda":
            return "portable"
        return "te" if gpt_layer_specs.HAVE_TE else "local"
    if backend not in SPEC_BACKENDS:
        raise ValueError(f"unknown layer spec backend {backend!r}; accepted: auto, {', '.join(SPEC_BACKENDS)}")
    if backend == "te" and not gpt_layer_specs.HAVE_TE:
        raise ValueError("layer spec backend 'te' needs Transformer Engine, which is not installed; use 'local'")
    if backend == "local" and device.type != "cuda":
        raise ValueError("megatron-core's local core attention needs CUDA; use backend 'portable' on CPU")
    return backend


def get_layer_spec(backend: str) -> ModuleSpec:
    """Transformer-layer spec for a Llama/Qwen2-shaped GPTModel.

    Args:
        backend: ``portable`` (megatron's local spec with ``SDPACoreAttention``; runs on CPU and GPU), ``local``
            (megatron's local spec unchanged; CUDA) or ``te`` (Transformer Engine; CUDA). Use
            ``resolve_spec_backend`` to turn ``auto`` into one of these.

    Returns:
        A fresh ModuleSpec (safe to modify).
    """
    if backend in ("portable", "local"):
        spec = gpt_layer_specs.get_gpt_layer_local_spec(normalization="RMSNorm")
        if backend == "portable":
            spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
        return spec
    if backend == "te":
        spec = gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
        # TE ignores the mask under a plain causal type; left padding needs it honoured as given
        spec.submodules.self_attention.params = {"attn_mask_type": AttnMaskType.arbitrary}
        spec.submodules.self_attention.submodules.core_attention = _te_attention_keeping_the_mask()
        return spec
    raise ValueError(f"unknown layer spec backend {backend!r}; accepted: {', '.join(SPEC_BACKENDS)}")


def _te_attention_keeping_the_mask() -> type:
    """Transformer Engine's core attention, told to apply a mask whenever it is given one.

    In a decode step (a key/value cache past the prefill, in eval mode) megatron-core's attention switches the mask
    type to ``no_mask`` while still passing the mask, and TE reads a mask only under a ``padding`` or ``arbitrary``
    type: the new token would attend to the prompt's left padding. The portable spec's core attention applies the
    mask it is given whatever the type; this makes TE's do the same.
    """
    from megatron.core.extensions.transformer_engine import TEDotProductAttention

    class TEDotProductAttentionKeepingTheMask(TEDotProductAttention):
        def forward(self, query, key, value, attention_mask, attn_mask_type, *args, **kwargs):
            if attention_mask is not None and attn_mask_type == AttnMaskType.no_mask:
                attn_mask_type = AttnMaskType.arbitrary
            return super().forward(query, key, value, attention_mask, attn_mask_type, *args, **kwargs)

    return TEDotProductAttentionKeepingTheMask
