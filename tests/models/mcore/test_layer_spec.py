"""Tests for verl.models.mcore.layer_spec: portable SDPA core attention, portable RoPE, spec selection."""

from __future__ import annotations

import math

import pytest
import torch
from megatron.core.transformer.enums import AttnMaskType

from verl.models.mcore import SDPACoreAttention, build_attention_mask, build_transformer_config, get_layer_spec
from verl.models.mcore.layer_spec import PortableRotaryEmbedding, resolve_spec_backend


def _reference_attention(query, key, value, masked):
    """Plain softmax attention; query head h reads key/value group h // (heads per group)."""
    sq, batch, num_heads, head_dim = query.shape
    per_group = num_heads // key.shape[2]
    out = torch.empty(sq, batch, num_heads, head_dim)
    for b in range(batch):
        for h in range(num_heads):
            g = h // per_group
            scores = query[:, b, h] @ key[:, b, g].T / math.sqrt(head_dim)
            scores = scores.masked_fill(masked[b, 0], float("-inf"))
            out[:, b, h] = torch.softmax(scores, dim=-1) @ value[:, b, g]
    return out.reshape(sq, batch, num_heads * head_dim)


@pytest.fixture
def attention(make_config):
    config = build_transformer_config(make_config("qwen2"), torch.float32)
    return SDPACoreAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")


def test_sdpa_attention_matches_reference_with_mask_and_gqa(attention):
    torch.manual_seed(0)
    seq, batch = 5, 2
    query = torch.randn(seq, batch, 4, 8)
    key, value = torch.randn(seq, batch, 2, 8), torch.randn(seq, batch, 2, 8)
    padding = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])  # left-padded row, right-padded row
    masked = build_attention_mask(padding)
    out = attention(query, key, value, masked)
    assert out.shape == (seq, batch, 32)
    torch.testing.assert_close(out, _reference_attention(query, key, value, masked), atol=1e-5, rtol=1e-5)


def test_sdpa_attention_adds_causality_to_a_padding_only_mask(attention):
    torch.manual_seed(1)
    query, key, value = torch.randn(4, 1, 4, 8), torch.randn(4, 1, 2, 8), torch.randn(4, 1, 2, 8)
    padding = torch.tensor([[1, 1, 1, 0]])
    key_only = (padding == 0)[:, None, None, :]  # (1, 1, 1, 4): masks key 3 for every query
    full = build_attention_mask(padding)
    # rows 0..2 are real queries; there both masks mean "causal and key is real"
    torch.testing.assert_close(attention(query, key, value, key_only)[:3], attention(query, key, value, full)[:3])
    no_mask = attention(query, key, value, None)
    expected = _reference_attention(query, key, value, ~torch.ones(4, 4, dtype=torch.bool).tril()[None, None])
    torch.testing.assert_close(no_mask, expected, atol=1e-5, rtol=1e-5)


def test_portable_rotary_embedding_angles_and_dtype():
    rope = PortableRotaryEmbedding(kv_channels=4, rotary_percent=1.0, rotary_base=100)
    emb = rope(3)
    assert emb.shape == (3, 1, 1, 4)
    # inv_freq = 100 ** (-[0, 2] / 4) = [1, 0.1]; angles at position p: [p, 0.1 p, p, 0.1 p]
    expected = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 0.1, 1.0, 0.1], [2.0, 0.2, 2.0, 0.2]])
    torch.testing.assert_close(emb[:, 0, 0], expected)
    rope.half()
    assert rope.inv_freq.dtype == torch.float32  # not rounded by a model-wide cast
    assert "inv_freq" not in rope.state_dict()


def test_spec_selection_on_cpu():
    cpu = torch.device("cpu")
    assert resolve_spec_backend("auto", cpu) == "portable"
    spec = get_layer_spec("portable")
    assert spec.submodules.self_attention.submodules.core_attention is SDPACoreAttention
    with pytest.raises(ValueError, match="needs CUDA"):
        resolve_spec_backend("local", cpu)
    with pytest.raises(ValueError, match="accepted: auto, portable, local, te"):
        resolve_spec_backend("flash", cpu)
