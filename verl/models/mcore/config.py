"""Translate a Hugging Face decoder config (Llama, Qwen2) into megatron-core's ``TransformerConfig``.

The supported families share one block shape — pre-RMSNorm, SwiGLU MLP, grouped-query attention with RoPE — and
differ only in whether q/k/v carry a bias. Everything the translation cannot represent faithfully (another
activation, sliding-window attention, biases outside q/k/v, RoPE scaling megatron cannot express) is rejected with
a ``ValueError`` here rather than producing a model whose logits silently differ from the Hugging Face one.
RoPE parameters are read from ``hf_config.rope_parameters`` (transformers 5.x) or the older ``rope_theta`` /
``rope_scaling`` attributes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer import TransformerConfig

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")

# megatron's llama3 RoPE scaling hard-codes these three constants; other values cannot be expressed.
_MEGATRON_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

# kernels megatron would fuse with apex/TE/CUDA extensions; off, since none of that exists on CPU and the
# unfused paths compute the same numbers
# Dropout off, as in the Hugging Face models at inference (RL computes log-probs that must match the rollout's).
_NO_DROPOUT = {"attention_dropout": 0.0, "hidden_dropout": 0.0}
_UNFUSED = {
    "attention_softmax_in_fp32": True,
    "masked_softmax_fusion": False,
    "bias_activation_fusion": False,
    "bias_dropout_fusion": False,
    "apply_rope_fusion": False,
    "gradient_accumulation_fusion": False,
    "persist_layer_norm": False,
}

# How Hugging Face configs of mixture-of-experts models count their experts (Qwen2/3-MoE, Mixtral, DeepSeek).
_EXPERT_COUNT_ATTRIBUTES = ("num_experts", "num_local_experts", "n_routed_experts")

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


@dataclasses.dataclass(frozen=True)
class RopeSettings:
    """The RoPE arguments GPTModel takes (they are constructor arguments there, not TransformerConfig fields)."""

    rotary_base: float
    rope_scaling: bool = False
    rope_scaling_factor: float = 8.0
    seq_len_interpolation_factor: float | None = None


def check_supported(hf_config: Any) -> str:
    """Return the config's ``model_type`` if this package can convert it, else raise ``ValueError``."""
    model_type = getattr(hf_config, "model_type", None)
    experts = next((name for name in _EXPERT_COUNT_ATTRIBUTES if getattr(hf_config, name, None)), None)
    if experts is not None:
        raise ValueError(
            f"model_type={model_type!r} is a mixture-of-experts model ({experts}={getattr(hf_config, experts)}): "
            "MoE models are out of scope here; the megatron backend builds dense "
            f"{' / '.join(SUPPORTED_MODEL_TYPES)} models."
        )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported Hugging Face architecture model_type={model_type!r} for the megatron backend; accepted: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}. Use the dp strategy for other architectures."
        )
    act = getattr(hf_config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported by the megatron conversion; accepted: 'silu'")
    if model_type == "qwen2" and getattr(hf_config, "use_sliding_window", False):
        raise ValueError("Qwen2 with use_sliding_window=True is not supported; set use_sliding_window=False")
    if model_type == "llama":
        if getattr(hf_config, "mlp_bias", False):
            raise ValueError("Llama with mlp_bias=True is not supported by the megatron conversion; use mlp_bias=False")
        if getattr(hf_config, "attention_bias", False):
            # HF puts that bias on o_proj too, and megatron can bias q/k/v alone or every linear layer.
            raise ValueError(
                "Llama with attention_bias=True is not supported: it also biases o_proj, which megatron's "
                "add_qkv_bias cannot express; use attention_bias=False"
            )
    return model_type


def _rope_parameters(hf_config: Any) -> dict[str, Any]:
    """RoPE parameters as one dict, from transformers 5.x ``rope_parameters`` or the 4.x attributes."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        merged = dict(params)
    else:
        merged = dict(getattr(hf_config, "rope_scaling", None) or {})
    if "rope_theta" not in merged:
        merged["rope_theta"] = getattr(hf_config, "rope_theta", 10000.0)
    merged.setdefault("rope_type", merged.get("type", "default"))
    return merged


def rope_settings(hf_config: Any) -> RopeSettings:
    """RoPE base and scaling for GPTModel from a Hugging Face config.

    Args:
        hf_config: a LlamaConfig or Qwen2Config.

    Returns:
        The GPTModel RoPE arguments.

    Raises:
        ValueError: a RoPE type other than default, linear or llama3 (with megatron's fixed constants).
    """
    params = _rope_parameters(hf_config)
    base = float(params["rope_theta"])
    rope_type = params["rope_type"]
    if rope_type == "default":
        return RopeSettings(rotary_base=base)
    if rope_type == "linear":
        return RopeSettings(rotary_base=base, seq_len_interpolation_factor=float(params["factor"]))
    if rope_type == "llama3":
        given = {k: float(params.get(k, v)) for k, v in _MEGATRON_LLAMA3_ROPE.items()}
        if given != _MEGATRON_LLAMA3_ROPE:
            raise ValueError(
                f"llama3 RoPE scaling with {given} is not expressible in megatron-core, which fixes "
                f"{_MEGATRON_LLAMA3_ROPE}"
            )
        return RopeSettings(rotary_base=base, rope_scaling=True, rope_scaling_factor=float(params["factor"]))
    raise ValueError(f"unsupported rope_type={rope_type!r}; accepted: 'default', 'linear', 'llama3'")


def _check_dtype(dtype: torch.dtype) -> None:
    if dtype not in _DTYPES:
        accepted = ", ".join(_DTYPES.values())
        raise ValueError(f"unsupported dtype {dtype}; accepted: {accepted} (torch.float32 etc.)")


def build_transformer_config(
    hf_config: Any,
    dtype: torch.dtype = torch.float32,
    *,
    use_cpu_initialization: bool = True,
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    **overrides: Any,
) -> TransformerConfig:
    """Build megatron-core's ``TransformerConfig`` for a Hugging Face Llama / Qwen2 config.

    Fusions that need CUDA kernels are off; dropout is zero, as in the Hugging Face models at inference.

    Args:
        hf_config: a ``LlamaConfig`` or ``Qwen2Config`` (anything with their attributes and ``model_type``).
        dtype: parameter and compute dtype: torch.float32, torch.float16 or torch.bfloat16.
        use_cpu_initialization: initialise weights on CPU (required without CUDA).
        tensor_model_parallel_size: megatron tensor-parallel size.
        pipeline_model_parallel_size: megatron pipeline-parallel size.
        **overrides: further ``TransformerConfig`` fields, applied last.

    Returns:
        The TransformerConfig.

    Raises:
        ValueError: unsupported architecture, activation, biases or dtype.
    """
    model_type = check_supported(hf_config)
    _check_dtype(dtype)
    num_heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
    kwargs: dict[str, Any] = {
        "num_layers": hf_config.num_hidden_layers,
        "hidden_size": hf_config.hidden_size,
        "ffn_hidden_size": hf_config.intermediate_size,
        "num_attention_heads": num_heads,
        "num_query_groups": getattr(hf_config, "num_key_value_heads", None) or num_heads,
        "kv_channels": head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": hf_config.rms_norm_eps,
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "add_bias_linear": False,
        "add_qkv_bias": model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
        **_NO_DROPOUT,
        "fp16": dtype == torch.float16,
        "bf16": dtype == torch.bfloat16,
        "params_dtype": dtype,
        "pipeline_dtype": dtype,
        "tensor_model_parallel_size": tensor_model_parallel_size,
        "pipeline_model_parallel_size": pipeline_model_parallel_size,
        "use_cpu_initialization": use_cpu_initialization,
        "init_method_std": getattr(hf_config, "initializer_range", 0.02),
        # megatron-core's default, "full", is deprecated and warns on every model built; [] means the same
        "cuda_graph_scope": [],
        **_UNFUSED,
    }
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)
