"""Tests for verl.models.mcore.lora: adapters on a GPTModel's linear layers, their switch and their merge."""

from __future__ import annotations

import pytest
import torch

from verl.models.mcore import build_gpt_model, forward_logits
from verl.models.mcore.lora import (
    LoraAdapter,
    adapters,
    adapters_disabled,
    add_lora_adapters,
    layer_sizes,
    merge_lora_state_dict,
)

KINDS = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]


def _batch():
    torch.manual_seed(3)
    input_ids = torch.randint(0, 64, (2, 10))
    return input_ids, torch.ones_like(input_ids), torch.arange(10).expand(2, 10)


def _logits(model):
    with torch.no_grad():
        return forward_logits(model, *_batch())


def test_layer_sizes_by_hand(make_config):
    # qwen2 tiny: hidden 32, 4 heads of 8 in 2 query groups, intermediate 64 (gated)
    model = build_gpt_model(make_config("qwen2"), seed=1)
    assert layer_sizes(model.config) == {
        "linear_qkv": (32, 32 + 2 * 2 * 8),  # queries 4 x 8, keys and values 2 x 8 each
        "linear_proj": (32, 32),
        "linear_fc1": (32, 2 * 64),  # gate and up
        "linear_fc2": (64, 32),
    }


def test_zero_b_keeps_the_model_and_only_adapters_train(make_config):
    model = build_gpt_model(make_config("qwen2"), seed=1)
    before = _logits(model)
    adapted = add_lora_adapters(model, rank=4, alpha=8, target_modules=KINDS)
    assert len(adapted) == 2 * 4  # two layers, four kinds each
    assert torch.equal(_logits(model), before)  # B = 0: the adapters add nothing yet
    trained = {name for name, param in model.named_parameters() if param.requires_grad}
    assert trained and all(".adapter.lora_" in name for name in trained)
    # rank 4 x (in + out) per layer: qkv 4 x (32 + 64), proj 4 x 64, fc1 4 x (32 + 128), fc2 4 x (64 + 32)
    assert sum(model.get_parameter(name).numel() for name in trained) == 2 * 4 * (96 + 64 + 160 + 96)
    assert all(float(adapter.scaling) == 2.0 for adapter in adapters(model))  # alpha / rank


def test_the_adapted_model_equals_its_merged_weights_and_the_switch_gives_the_base(make_config):
    config = make_config("qwen2")
    model = build_gpt_model(config, seed=1)
    base = _logits(model)
    add_lora_adapters(model, rank=4, alpha=8, target_modules=KINDS, init_b="normal", seed=5)
    adapted = _logits(model)
    assert (adapted - base).abs().max() > 1e-3  # a non-zero B moves the logits
    with adapters_disabled(model):
        assert torch.equal(_logits(model), base)
    assert torch.equal(_logits(model), adapted)  # switched back on
    plain = build_gpt_model(config, seed=2)
    merged = merge_lora_state_dict(model.state_dict())
    assert not any(".adapter." in key for key in merged)
    missing, unexpected = plain.load_state_dict(merged, strict=False)
    assert [key for key in missing if not key.endswith("_extra_state")] == [] and unexpected == []
    torch.testing.assert_close(_logits(plain), adapted, atol=1e-5, rtol=0)


def test_gradients_reach_the_adapters_and_a_step_leaves_the_base_weights(make_config):
    model = build_gpt_model(make_config("qwen2"), seed=1)
    add_lora_adapters(model, rank=4, alpha=8, target_modules=["linear_qkv", "linear_fc2"], seed=5)
    base = {name: param.detach().clone() for name, param in model.named_parameters() if not param.requires_grad}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    input_ids, attention_mask, position_ids = _batch()
    before = _logits(model)
    loss = -torch.log_softmax(forward_logits(model, input_ids, attention_mask, position_ids), -1).mean()
    loss.backward()
    # B = 0 at the start: A's gradient is B^T (...) = 0, B's is not
    for adapter in adapters(model):
        assert adapter.lora_B.weight.grad.abs().sum() > 0
        assert adapter.lora_A.weight.grad.abs().sum() == 0
    optimizer.step()
    assert not torch.equal(_logits(model), before)
    for name, param in model.named_parameters():
        if name in base:
            assert torch.equal(param, base[name]), name
    with adapters_disabled(model):
        assert torch.equal(_logits(model), before)  # the base model is the reference policy, unchanged


def test_exclusions_and_bad_targets(make_config):
    model = build_gpt_model(make_config("qwen2"), seed=1)
    adapted = add_lora_adapters(model, rank=2, alpha=2, target_modules=KINDS, exclude_modules=["linear_fc1"])
    assert adapted and not any(name.endswith("linear_fc1") for name in adapted)
    with pytest.raises(ValueError, match=r"\['q_proj'\] are not megatron-core linear layers"):
        add_lora_adapters(build_gpt_model(make_config("qwen2"), seed=1), rank=2, alpha=2, target_modules=["q_proj"])
    with pytest.raises(ValueError, match=r"match no layer"):
        add_lora_adapters(
            build_gpt_model(make_config("qwen2"), seed=1),
            rank=2,
            alpha=2,
            target_modules=["linear_qkv"],
            exclude_modules=["linear_qkv"],
        )


def test_an_adapter_of_a_norm_fused_layer_normalises_its_input():
    # Transformer Engine's LayerNormColumnParallelLinear gets the un-normalised input; its adapter must see
    # rmsnorm(x) * w, as the layer's matrix does
    torch.manual_seed(0)
    norm_weight = torch.rand(8) + 0.5
    adapter = LoraAdapter(
        "linear_qkv", (8, 6), 2, 4.0, init_a="kaiming", init_b="normal", generator=torch.Generator().manual_seed(1)
    )
    fused = LoraAdapter(
        "linear_qkv",
        (8, 6),
        2,
        4.0,
        init_a="kaiming",
        init_b="normal",
        generator=torch.Generator().manual_seed(1),
        norm_weight=norm_weight,
        norm_eps=1e-6,
    )
    x = torch.randn(3, 8)
    normed = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_weight
    torch.testing.assert_close(fused(x), adapter(normed))
    # scaling 4 / 2 = 2 times B A x
    torch.testing.assert_close(adapter(x), 2.0 * x @ adapter.lora_A.weight.T @ adapter.lora_B.weight.T)


def test_merge_names_what_is_missing():
    state = {"l.linear_qkv.weight": torch.zeros(2, 2), "l.linear_qkv.adapter.lora_A.weight": torch.zeros(1, 2)}
    with pytest.raises(ValueError, match=r"LoRA layer l.linear_qkv lacks .*lora_B.weight"):
        merge_lora_state_dict(state)


def test_an_excluded_layer_is_named_as_in_the_whole_model_on_any_stage():
    # The second of two pipeline stages holds the whole model's layers 2 and 3 (0-based) as its own layers 0 and 1
    # (megatron numbers layer_number from 1 over the whole model). Excluding decoder.layers.3.mlp.linear_fc1 must
    # leave out that stage's second layer, not its first, nor nothing.
    from verl.models.mcore.lora import _targets

    class Layer(torch.nn.Module):
        def __init__(self, layer_number):
            super().__init__()
            self.layer_number = layer_number
            self.mlp = torch.nn.Module()
            self.mlp.linear_fc1 = torch.nn.Linear(2, 2)

    stage = torch.nn.Module()
    stage.decoder = torch.nn.Module()
    stage.decoder.layers = torch.nn.ModuleList([Layer(3), Layer(4)])
    found = [name for name, _ in _targets(stage, ["linear_fc1"], ["decoder.layers.3.mlp.linear_fc1"])]
    assert found == ["decoder.layers.0.mlp.linear_fc1"]
    # a pattern without a layer number matches on every stage, as before
    assert _targets(stage, ["linear_fc1"], ["linear_fc1"]) == []
