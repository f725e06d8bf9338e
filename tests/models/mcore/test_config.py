"""Tests for verl.models.mcore.config: HF config -> TransformerConfig and RoPE settings."""

from __future__ import annotations

import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config

from verl.models.mcore import build_gpt_model, build_transformer_config, rope_settings


def test_qwen2_fields(make_config):
    config = build_transformer_config(make_config("qwen2"), torch.float32)
    assert config.num_layers == 2
    assert config.hidden_size == 32
    assert config.ffn_hidden_size == 64
    assert config.num_attention_heads == 4
    assert config.num_query_groups == 2
    assert config.kv_channels == 8  # 32 hidden / 4 heads
    assert config.normalization == "RMSNorm"
    assert config.layernorm_epsilon == pytest.approx(1e-6)
    assert config.gated_linear_unit is True
    assert config.activation_func is F.silu
    assert config.add_bias_linear is False
    assert config.add_qkv_bias is True  # Qwen2 always biases q/k/v
    assert config.attention_dropout == 0.0 and config.hidden_dropout == 0.0
    assert config.tensor_model_parallel_size == 1 and config.pipeline_model_parallel_size == 1
    assert (config.fp16, config.bf16, config.params_dtype) == (False, False, torch.float32)


def test_the_config_is_built_without_a_deprecation_warning(make_config):
    # megatron-core 0.16's own default cuda_graph_scope="full" warns "full scope is deprecated" on every build
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = build_transformer_config(make_config("qwen2"), torch.float16)
    assert [str(w.message) for w in caught if "deprecat" in str(w.message).lower()] == []
    assert config.cuda_graph_scope == []  # what "full" meant: the whole layer


def test_llama_fields_and_dtypes(make_config):
    hf = make_config("llama")
    fp16 = build_transformer_config(hf, torch.float16)
    assert fp16.add_qkv_bias is False
    assert (fp16.fp16, fp16.bf16, fp16.params_dtype) == (True, False, torch.float16)
    bf16 = build_transformer_config(hf, torch.bfloat16, tensor_model_parallel_size=1)
    assert (bf16.fp16, bf16.bf16, bf16.params_dtype) == (False, True, torch.bfloat16)


def test_rope_base_from_rope_parameters(make_config):
    # transformers 5.x keeps rope_theta inside rope_parameters
    hf = make_config("llama", rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    assert rope_settings(hf).rotary_base == 5000.0
    assert rope_settings(hf).rope_scaling is False


def test_rope_base_from_legacy_attributes():
    legacy = types.SimpleNamespace(rope_theta=123.0, rope_scaling={"type": "linear", "factor": 2.0})
    settings = rope_settings(legacy)
    assert settings.rotary_base == 123.0
    assert settings.seq_len_interpolation_factor == 2.0


def test_llama3_rope_scaling():
    params = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0}
    params.update({"high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    settings = rope_settings(types.SimpleNamespace(rope_parameters=params))
    assert (settings.rope_scaling, settings.rope_scaling_factor) == (True, 8.0)
    params["high_freq_factor"] = 2.0  # megatron hard-codes 4
    with pytest.raises(ValueError, match="llama3"):
        rope_settings(types.SimpleNamespace(rope_parameters=params))


def test_unsupported_architecture_is_rejected():
    gpt2 = GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64)
    with pytest.raises(ValueError, match=r"model_type='gpt2'.*llama, qwen2"):
        build_transformer_config(gpt2, torch.float32)
    with pytest.raises(ValueError, match="accepted: llama, qwen2"):
        build_gpt_model(gpt2)


def test_unrepresentable_options_are_rejected(make_config):
    with pytest.raises(ValueError, match="attention_bias"):
        build_transformer_config(make_config("llama", attention_bias=True), torch.float32)
    with pytest.raises(ValueError, match="hidden_act"):
        build_transformer_config(make_config("qwen2", hidden_act="gelu"), torch.float32)
    with pytest.raises(ValueError, match="unsupported dtype"):
        build_transformer_config(make_config("qwen2"), torch.float64)
