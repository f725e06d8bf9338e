"""Convert weights between Hugging Face Llama/Qwen2 state dicts and megatron-core GPTModel state dicts.

Two megatron layouts differ from Hugging Face. The attention input projection is one fused ``linear_qkv`` whose
rows are grouped per key/value head: for each query group ``g`` the rows of its ``np // ng`` query heads, then
its key head, then its value head (``[q_g0.., k_g, v_g]`` repeated ``ng`` times), which is how megatron's
``SelfAttention`` splits it. The MLP's ``gate_proj`` and ``up_proj`` are stacked (gate first) into ``linear_fc1``,
matching megatron's gated-linear-unit split ``act(x[:half]) * x[half:]``. RMSNorm weights sit in the transformer
layer (``input_layernorm`` / ``pre_mlp_layernorm``) in megatron's local spec, but inside the fused linears
(``linear_qkv.layer_norm_weight`` / ``linear_fc1.layer_norm_weight``) in the Transformer Engine spec; the
``norm_in_linear`` flag selects which. megatron's ``_extra_state`` entries carry no weights and are skipped.

Tensor parallelism: ``hf_to_mcore_state_dict(..., tp_rank=r, tp_size=n)`` keeps only rank ``r``'s shard of each
converted tensor (:mod:`verl.models.mcore.tensor_parallel`), one tensor at a time, so a rank never holds the whole
converted model; the way back (``export_mcore_to_hf``, ``iter_hf_weights``) gathers the shards over the
tensor-parallel group first. Pipeline-parallel models are not converted here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from verl.models.mcore.config import check_supported
from verl.models.mcore.tensor_parallel import gather_state_dict, shard_state_dict

_HF_LAYER = "model.layers.{i}."
_MC_LAYER = "decoder.layers.{i}."
# megatron/torch keep these in state dicts without them being weights
_IGNORED_SUFFIXES = ("_extra_state", "rotary_emb.inv_freq", "rotary_pos_emb.inv_freq")


def _dims(hf_config: Any) -> tuple[int, int, int]:
    """(num_query_groups, query heads per group, head_dim) of the config."""
    num_heads = hf_config.num_attention_heads
    num_groups = getattr(hf_config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
    return num_groups, num_heads // num_groups, head_dim


def _norm_keys(norm_in_linear: bool) -> tuple[str, str]:
    """megatron names of the pre-attention and pre-MLP RMSNorm weights, relative to the layer prefix."""
    if norm_in_linear:
        return "self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight"
    return "input_layernorm.weight", "pre_mlp_layernorm.weight"


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hf_config: Any) -> torch.Tensor:
    """HF q/k/v (weights ``(heads*hd, H)`` or biases ``(heads*hd,)``) -> megatron's grouped fused tensor."""
    num_groups, q_per_group, head_dim = _dims(hf_config)
    tail = q.shape[1:]
    q = q.reshape(num_groups, q_per_group * head_dim, *tail)
    k = k.reshape(num_groups, head_dim, *tail)
    v = v.reshape(num_groups, head_dim, *tail)
    return torch.cat([q, k, v], dim=1).reshape(num_groups * (q_per_group + 2) * head_dim, *tail)


def _split_qkv(qkv: torch.Tensor, hf_config: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of ``_fuse_qkv``."""
    num_groups, q_per_group, head_dim = _dims(hf_config)
    tail = qkv.shape[1:]
    grouped = qkv.reshape(num_groups, (q_per_group + 2) * head_dim, *tail)
    q, k, v = torch.split(grouped, [q_per_group * head_dim, head_dim, head_dim], dim=1)
    return (
        q.reshape(num_groups * q_per_group * head_dim, *tail),
        k.reshape(num_groups * head_dim, *tail),
        v.reshape(num_groups * head_dim, *tail),
    )


def _weights_only(state_dict: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state_dict.items() if not k.endswith(_IGNORED_SUFFIXES)}


def _check_consumed(remaining: dict[str, Any], side: str) -> None:
    if remaining:
        names = ", ".join(sorted(remaining)[:8])
        raise ValueError(
            f"unexpected keys in the {side} state dict ({len(remaining)}): {names}; the converter handles "
            "Llama/Qwen2 decoders with untied or tied embeddings only"
        )


def _take(state: dict[str, torch.Tensor], key: str, side: str) -> torch.Tensor:
    if key not in state:
        raise ValueError(f"missing key {key!r} in the {side} state dict; is it the state dict of this config?")
    return state.pop(key)


class _ShardingDict(dict):
    """A dict that keeps only one tensor-parallel rank's shard of every tensor stored in it (a copy, so that the
    full converted tensor is freed at once)."""

    def __init__(self, tp_rank: int, tp_size: int):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        if self.tp_size > 1:
            value = shard_state_dict({key: value}, self.tp_rank, self.tp_size)[key].clone()
        super().__setitem__(key, value)


def hf_to_mcore_state_dict(
    hf_state_dict: dict[str, torch.Tensor],
    hf_config: Any,
    *,
    norm_in_linear: bool = False,
    tp_rank: int = 0,
    tp_size: int = 1,
) -> dict[str, torch.Tensor]:
    """Map a Hugging Face Llama/Qwen2 ``state_dict`` onto megatron-core GPTModel names and layouts.

    Args:
        hf_state_dict: the ``*ForCausalLM`` state dict (``model.*`` and ``lm_head.weight``; ``lm_head.weight``
            may be absent when embeddings are tied).
        hf_config: its config.
        norm_in_linear: True for the Transformer Engine spec (RMSNorm inside the fused linears).
        tp_rank: the tensor-parallel rank whose shards to keep.
        tp_size: the tensor-parallel size (1: whole tensors).

    Returns:
        The megatron state dict (no ``_extra_state``; no ``output_layer.weight`` when embeddings are tied), each
        tensor ``tp_rank``'s shard when ``tp_size > 1``.

    Raises:
        ValueError: unsupported architecture, or missing/unexpected keys.
    """
    model_type = check_supported(hf_config)
    src = _weights_only(hf_state_dict)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    attn_norm, mlp_norm = _norm_keys(norm_in_linear)
    out: dict[str, torch.Tensor] = _ShardingDict(tp_rank, tp_size)
    out["embedding.word_embeddings.weight"] = _take(src, "model.embed_tokens.weight", "HF")
    for i in range(hf_config.num_hidden_layers):
        hf, mc = _HF_LAYER.format(i=i), _MC_LAYER.format(i=i)
        attn = hf + "self_attn."
        out[mc + attn_norm] = _take(src, hf + "input_layernorm.weight", "HF")
        qkv = [_take(src, f"{attn}{p}_proj.weight", "HF") for p in "qkv"]
        out[mc + "self_attention.linear_qkv.weight"] = _fuse_qkv(*qkv, hf_config)
        if model_type == "qwen2":
            biases = [_take(src, f"{attn}{p}_proj.bias", "HF") for p in "qkv"]
            out[mc + "self_attention.linear_qkv.bias"] = _fuse_qkv(*biases, hf_config)
        out[mc + "self_attention.linear_proj.weight"] = _take(src, attn + "o_proj.weight", "HF")
        out[mc + mlp_norm] = _take(src, hf + "post_attention_layernorm.weight", "HF")
        gate = _take(src, hf + "mlp.gate_proj.weight", "HF")
        up = _take(src, hf + "mlp.up_proj.weight", "HF")
        out[mc + "mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
        out[mc + "mlp.linear_fc2.weight"] = _take(src, hf + "mlp.down_proj.weight", "HF")
    out["decoder.final_layernorm.weight"] = _take(src, "model.norm.weight", "HF")
    if tied:
        src.pop("lm_head.weight", None)  # the same tensor as the embedding
    else:
        out["output_layer.weight"] = _take(src, "lm_head.weight", "HF")
    _check_consumed(src, "HF")
    return dict(out)


def iter_mcore_to_hf(
    mcore_state_dict: dict[str, torch.Tensor], hf_config: Any, *, norm_in_linear: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """``mcore_to_hf_state_dict`` lazily: the Hugging Face ``(name, tensor)`` pairs, one layer's worth at a time.

    What is converted lives only until the consumer drops it, so streaming a model into an inference engine never
    holds the converted model at once (only the attention tensors are copies; the rest are views).

    Args:
        mcore_state_dict: a full (tensor-parallel size 1) GPTModel state dict; ``_extra_state`` keys are skipped.
        hf_config: the Hugging Face config the model was built from.
        norm_in_linear: True for the Transformer Engine spec (RMSNorm inside the fused linears).

    Yields:
        ``(name, tensor)`` in Hugging Face order: embedding, each layer, final norm, ``lm_head.weight`` (the
        embedding tensor itself when tied).

    Raises:
        ValueError: unsupported architecture, or missing keys (when reached) or unexpected keys (after the last
            pair).
    """
    model_type = check_supported(hf_config)
    src = _weights_only(mcore_state_dict)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    attn_norm, mlp_norm = _norm_keys(norm_in_linear)
    embed = _take(src, "embedding.word_embeddings.weight", "megatron")
    yield "model.embed_tokens.weight", embed
    for i in range(hf_config.num_hidden_layers):
        hf, mc = _HF_LAYER.format(i=i), _MC_LAYER.format(i=i)
        attn = hf + "self_attn."
        yield hf + "input_layernorm.weight", _take(src, mc + attn_norm, "megatron")
        q, k, v = _split_qkv(_take(src, mc + "self_attention.linear_qkv.weight", "megatron"), hf_config)
        yield from ((attn + "q_proj.weight", q), (attn + "k_proj.weight", k), (attn + "v_proj.weight", v))
        if model_type == "qwen2":
            qb, kb, vb = _split_qkv(_take(src, mc + "self_attention.linear_qkv.bias", "megatron"), hf_config)
            yield from ((attn + "q_proj.bias", qb), (attn + "k_proj.bias", kb), (attn + "v_proj.bias", vb))
        yield attn + "o_proj.weight", _take(src, mc + "self_attention.linear_proj.weight", "megatron")
        yield hf + "post_attention_layernorm.weight", _take(src, mc + mlp_norm, "megatron")
        gate, up = torch.chunk(_take(src, mc + "mlp.linear_fc1.weight", "megatron"), 2, dim=0)
        yield from ((hf + "mlp.gate_proj.weight", gate), (hf + "mlp.up_proj.weight", up))
        yield hf + "mlp.down_proj.weight", _take(src, mc + "mlp.linear_fc2.weight", "megatron")
    yield "model.norm.weight", _take(src, "decoder.final_layernorm.weight", "megatron")
    if tied:
        src.pop("output_layer.weight", None)  # a last pipeline stage may hold a copy of the embedding
        yield "lm_head.weight", embed
    else:
        yield "lm_head.weight", _take(src, "output_layer.weight", "megatron")
    _check_consumed(src, "megatron")


def mcore_to_hf_state_dict(
    mcore_state_dict: dict[str, torch.Tensor], hf_config: Any, *, norm_in_linear: bool = False
) -> dict[str, torch.Tensor]:
    """Exact inverse of ``hf_to_mcore_state_dict``: megatron-core GPTModel names back to Hugging Face ones.

    Args:
        mcore_state_dict: a full (tensor-parallel size 1) GPTModel state dict; ``_extra_state`` keys are skipped.
        hf_config: the Hugging Face config the model was built from.
        norm_in_linear: True for the Transformer Engine spec (RMSNorm inside the fused linears).

    Returns:
        The Hugging Face state dict, including ``lm_head.weight`` (the embedding tensor itself when tied, as
        ``*ForCausalLM.state_dict()`` has it). Fused tensors come back as views of the inputs.

    Raises:
        ValueError: unsupported architecture, or missing/unexpected keys.
    """
    return dict(iter_mcore_to_hf(mcore_state_dict, hf_config, norm_in_linear=norm_in_linear))


def _uses_norm_in_linear(model: torch.nn.Module) -> bool:
    """Whether the model's RMSNorm weights live inside its fused linears (Transformer Engine spec)."""
    return any(name.endswith("linear_qkv.layer_norm_weight") for name, _ in model.named_parameters())


def _tensor_parallel_size(model: torch.nn.Module) -> int:
    """The model's tensor-parallel size."""
    return int(getattr(getattr(model, "config", None), "tensor_model_parallel_size", 1))


def _full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain model's state dict with full tensors: its own, or the shards gathered over the tensor-parallel
    group and the stages gathered over the pipeline group (a collective every rank of the model-parallel group must
    join); LoRA adapters merged into their layers' weights."""
    from verl.models.mcore.lora import merge_lora_state_dict

    return merge_lora_state_dict(gather_model_parallel_state_dict(model, _weights_only(model.state_dict())))


def gather_model_parallel_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The whole model's ``state`` (megatron names) from this rank's part of it: the tensor-parallel shards
    gathered over the tensor-parallel group, then the pipeline stages over the pipeline group (collectives)."""
    from verl.models.mcore.pipeline import PipelineStage, gather_stages

    tp = _tensor_parallel_size(model)
    if tp > 1:
        from megatron.core import parallel_state

        state = gather_state_dict(state, parallel_state.get_tensor_model_parallel_group(), tp)
    stage = PipelineStage.of_model(model)
    return state if stage is None else gather_stages(state, model, stage)


def load_hf_weights_into_mcore(
    model: torch.nn.Module, hf_model_or_state_dict: Any, hf_config: Any | None = None
) -> None:
    """Copy Hugging Face weights into a GPTModel built by ``build_gpt_model`` (values cast to its dtype).

    Args:
        model: the megatron GPTModel (this rank's part: with tensor parallelism its shard of every tensor, with
            pipeline parallelism its stage's layers).
        hf_model_or_state_dict: a ``*ForCausalLM`` module, or its state dict (then ``hf_config`` is required).
        hf_config: the Hugging Face config; defaults to ``hf_model.config``.

    Raises:
        ValueError: a missing config, a sharded model, or keys that do not match.
    """
    if isinstance(hf_model_or_state_dict, torch.nn.Module):
        hf_config = hf_config if hf_config is not None else hf_model_or_state_dict.config
        hf_state_dict = hf_model_or_state_dict.state_dict()
    else:
        hf_state_dict = hf_model_or_state_dict
    if hf_config is None:
        raise ValueError("hf_config is required when a state dict (not a Hugging Face model) is given")
    tp_size = _tensor_parallel_size(model)
    tp_rank = 0
    if tp_size > 1:
        from megatron.core import parallel_state

        tp_rank = parallel_state.get_tensor_model_parallel_rank()
    mcore = hf_to_mcore_state_dict(
        hf_state_dict, hf_config, norm_in_linear=_uses_norm_in_linear(model), tp_rank=tp_rank, tp_size=tp_size
    )
    from verl.models.mcore.pipeline import PipelineStage, stage_state_dict

    if PipelineStage.of_model(model) is not None:
        mcore = stage_state_dict(mcore, model)  # this stage's layers (and embedding / output layer)
    result = model.load_state_dict(mcore, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith(_IGNORED_SUFFIXES)]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"converted weights do not fit the model: missing {missing[:8]}, unexpected {result.unexpected_keys[:8]};"
            " build the model from the same Hugging Face config"
        )


def iter_hf_weights(model: torch.nn.Module, hf_config: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """A GPTModel's current weights as Hugging Face ``(name, tensor)`` pairs, layer by layer, without copying the
    model (see :func:`iter_mcore_to_hf`); for streaming them into an inference engine. A tensor-parallel model's
    shards are gathered first (a collective of the tensor-parallel group, holding the full weights at once).

    Args:
        model: the megatron GPTModel (this rank's part of it; the parts are gathered).
        hf_config: the Hugging Face config it was built from.
    """
    return iter_mcore_to_hf(_full_state_dict(model), hf_config, norm_in_linear=_uses_norm_in_linear(model))


def export_mcore_to_hf(model: torch.nn.Module, hf_config: Any) -> dict[str, torch.Tensor]:
    """Hugging Face state dict of a GPTModel's current weights (detached copies, in the model's dtype).

    Args:
        model: the megatron GPTModel (a split model's parts are gathered, a collective every rank of its
            model-parallel group must join).
        hf_config: the Hugging Face config it was built from.

    Returns:
        A state dict loadable with ``*ForCausalLM.load_state_dict``.
    """
    hf = mcore_to_hf_state_dict(_full_state_dict(model), hf_config, norm_in_linear=_uses_norm_in_linear(model))
    copies: dict[int, torch.Tensor] = {}
    # tied embeddings must stay one tensor after copying, as in the source
    return {k: copies.setdefault(id(v), v.detach().clone()) for k, v in hf.items()}
