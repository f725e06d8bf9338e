"""Tests for verl.models.mcore.weight_converter: layouts by hand, exact round trips, key checking."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import LlamaForCausalLM, Qwen2ForCausalLM

from verl.models.mcore import (
    build_gpt_model,
    export_mcore_to_hf,
    hf_to_mcore_state_dict,
    load_hf_weights_into_mcore,
    mcore_to_hf_state_dict,
)

HF_CLASSES = {"qwen2": Qwen2ForCausalLM, "llama": LlamaForCausalLM}


def _one_layer_config(model_type):
    """4 heads of dim 1 in 2 groups, so every fused row is one head and the layout can be read off by eye."""
    return types.SimpleNamespace(
        model_type=model_type,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=4,
        head_dim=1,
        num_hidden_layers=1,
        tie_word_embeddings=True,
    )


def _one_layer_hf_state(with_bias):
    def rows(*values):
        return torch.tensor(values, dtype=torch.float32)[:, None].repeat(1, 4)

    state = {
        "model.embed_tokens.weight": torch.zeros(8, 4),
        "model.layers.0.input_layernorm.weight": torch.ones(4),
        "model.layers.0.self_attn.q_proj.weight": rows(10, 11, 12, 13),
        "model.layers.0.self_attn.k_proj.weight": rows(20, 21),
        "model.layers.0.self_attn.v_proj.weight": rows(30, 31),
        "model.layers.0.self_attn.o_proj.weight": torch.zeros(4, 4),
        "model.layers.0.post_attention_layernorm.weight": torch.full((4,), 2.0),
        "model.layers.0.mlp.gate_proj.weight": rows(1, 2),
        "model.layers.0.mlp.up_proj.weight": rows(3, 4),
        "model.layers.0.mlp.down_proj.weight": torch.zeros(4, 2),
        "model.norm.weight": torch.ones(4),
    }
    if with_bias:
        state.update({f"model.layers.0.self_attn.{p}_proj.bias": rows(*v)[:, 0] for p, v in zip("qkv", _BIASES)})
    return state


_BIASES = [(10, 11, 12, 13), (20, 21), (30, 31)]


def test_fused_layouts_by_hand():
    mcore = hf_to_mcore_state_dict(_one_layer_hf_state(True), _one_layer_config("qwen2"))
    # group 0: q heads 0,1 then k0, v0; group 1: q heads 2,3 then k1, v1
    expected_qkv = [10.0, 11.0, 20.0, 30.0, 12.0, 13.0, 21.0, 31.0]
    assert mcore["decoder.layers.0.self_attention.linear_qkv.weight"][:, 0].tolist() == expected_qkv
    assert mcore["decoder.layers.0.self_attention.linear_qkv.bias"].tolist() == expected_qkv
    # gate rows first, then up rows
    assert mcore["decoder.layers.0.mlp.linear_fc1.weight"][:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert mcore["decoder.layers.0.pre_mlp_layernorm.weight"].tolist() == [2.0] * 4
    assert "output_layer.weight" not in mcore  # tied


def test_norm_in_linear_layout_names():
    mcore = hf_to_mcore_state_dict(_one_layer_hf_state(False), _one_layer_config("llama"), norm_in_linear=True)
    assert mcore["decoder.layers.0.mlp.linear_fc1.layer_norm_weight"].tolist() == [2.0] * 4
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in mcore
    assert "decoder.layers.0.input_layernorm.weight" not in mcore
    back = mcore_to_hf_state_dict(mcore, _one_layer_config("llama"), norm_in_linear=True)
    assert torch.equal(back["model.layers.0.post_attention_layernorm.weight"], torch.full((4,), 2.0))


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("tie", [True, False])
def test_hf_round_trip_is_exact(make_config, arch, tie):
    hf_config = make_config(arch, tie=tie)
    torch.manual_seed(0)
    hf_state = HF_CLASSES[arch](hf_config).state_dict()
    back = mcore_to_hf_state_dict(hf_to_mcore_state_dict(hf_state, hf_config), hf_config)
    assert set(back) == set(hf_state)
    assert all(torch.equal(back[k], hf_state[k]) for k in hf_state)


@pytest.mark.parametrize("tie", [True, False])
def test_export_loads_back_into_hugging_face(make_config, tie):
    hf_config = make_config("qwen2", tie=tie)
    model = build_gpt_model(hf_config, seed=5)
    exported = export_mcore_to_hf(model, hf_config)
    hf = Qwen2ForCausalLM(hf_config)
    hf.load_state_dict(exported, strict=True)
    # and back again: the megatron weights survive mcore -> HF -> mcore bit for bit
    fresh = build_gpt_model(hf_config, seed=6)
    load_hf_weights_into_mcore(fresh, hf)
    original = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    reloaded = {k: v for k, v in fresh.state_dict().items() if not k.endswith("_extra_state")}
    assert set(original) == set(reloaded)
    assert all(torch.equal(original[k], reloaded[k]) for k in original)


def test_extra_state_keys_are_ignored(make_config):
    hf_config = make_config("llama")
    mcore = build_gpt_model(hf_config, seed=0).state_dict()
    assert any(k.endswith("_extra_state") for k in mcore)
    hf_state = mcore_to_hf_state_dict(mcore, hf_config)
    assert not any("extra_state" in k for k in hf_state)


def test_key_mismatches_are_errors(make_config):
    hf_config = make_config("qwen2")
    hf_state = Qwen2ForCausalLM(hf_config).state_dict()
    with pytest.raises(ValueError, match="unexpected keys in the HF state dict"):
        hf_to_mcore_state_dict({**hf_state, "model.layers.9.mlp.extra.weight": torch.zeros(1)}, hf_config)
    missing = {k: v for k, v in hf_state.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match="missing key 'model.norm.weight'"):
        hf_to_mcore_state_dict(missing, hf_config)
    with pytest.raises(ValueError, match="hf_config is required"):
        load_hf_weights_into_mcore(build_gpt_model(hf_config), hf_state)
