"""Sharded HF -> megatron conversion: each tensor-parallel rank's part is the matching slice of the full conversion.

The tiny configs have 4 query heads in 2 query groups (head_dim 8, hidden 32), MLP width 64 and a vocabulary of 64,
so with tp=2 rank r holds query group r (its 2 query heads, its key and its value head: 4 * 8 = 32 of the 64 fused
rows), MLP features 32r .. 32r+31 of gate and of up, and vocabulary rows 32r .. 32r+31.
"""

import pytest
import torch

from verl.models.mcore.tensor_parallel import (
    _concat,
    check_tensor_parallel_fits,
    shard_rule,
    shard_state_dict,
)
from verl.models.mcore.weight_converter import hf_to_mcore_state_dict

HEAD_DIM, NUM_GROUPS, Q_PER_GROUP = 8, 2, 2


def hf_weights(config, seed=0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).state_dict()


@pytest.mark.parametrize("arch, tie", [("qwen2", True), ("qwen2", False), ("llama", False)])
def test_sharded_conversion_equals_slicing_the_full_conversion(make_config, arch, tie):
    config = make_config(arch, tie=tie)
    hf = hf_weights(config)
    full = hf_to_mcore_state_dict(hf, config)
    for rank in (0, 1):
        sharded = hf_to_mcore_state_dict(hf, config, tp_rank=rank, tp_size=2)
        sliced = shard_state_dict(full, rank, 2)
        assert sharded.keys() == full.keys()
        for key in full:
            assert torch.equal(sharded[key], sliced[key]), key


def test_shards_are_the_megatron_layout_of_the_hf_tensors(make_config):
    config = make_config("qwen2", tie=True)
    hf = hf_weights(config)
    layer, rank = "decoder.layers.1.", 1
    shard = hf_to_mcore_state_dict(hf, config, tp_rank=rank, tp_size=2)
    attn = "model.layers.1.self_attn."
    q_rows = slice(rank * Q_PER_GROUP * HEAD_DIM, (rank + 1) * Q_PER_GROUP * HEAD_DIM)  # query group r's heads
    kv_rows = slice(rank * HEAD_DIM, (rank + 1) * HEAD_DIM)  # its key/value head
    want_qkv = torch.cat([hf[attn + "q_proj.weight"][q_rows], hf[attn + "k_proj.weight"][kv_rows]])
    want_qkv = torch.cat([want_qkv, hf[attn + "v_proj.weight"][kv_rows]])
    assert torch.equal(shard[layer + "self_attention.linear_qkv.weight"], want_qkv)
    want_bias = torch.cat(
        [hf[attn + f"{p}_proj.bias"][rows] for p, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows))]
    )
    assert torch.equal(shard[layer + "self_attention.linear_qkv.bias"], want_bias)
    # row-parallel: the input features of this rank's heads / MLP features
    assert torch.equal(shard[layer + "self_attention.linear_proj.weight"], hf[attn + "o_proj.weight"][:, 16:32])
    mlp = "model.layers.1.mlp."
    assert torch.equal(shard[layer + "mlp.linear_fc2.weight"], hf[mlp + "down_proj.weight"][:, 32:64])
    # gated MLP: this rank's gate rows, then its up rows
    want_fc1 = torch.cat([hf[mlp + "gate_proj.weight"][32:64], hf[mlp + "up_proj.weight"][32:64]])
    assert torch.equal(shard[layer + "mlp.linear_fc1.weight"], want_fc1)
    # vocabulary-parallel embedding (tied: no separate output layer); norms replicated
    assert torch.equal(shard["embedding.word_embeddings.weight"], hf["model.embed_tokens.weight"][32:64])
    assert "output_layer.weight" not in shard
    assert torch.equal(shard[layer + "input_layernorm.weight"], hf["model.layers.1.input_layernorm.weight"])


def test_concatenating_the_shards_gives_the_full_tensors_back(make_config):
    config = make_config("llama", tie=False)
    full = hf_to_mcore_state_dict(hf_weights(config), config)
    shards = [shard_state_dict(full, rank, 2) for rank in (0, 1)]
    for key, value in full.items():
        rule = shard_rule(key)
        if rule == "replicated":
            assert all(torch.equal(s[key], value) for s in shards), key
        else:
            assert torch.equal(_concat([s[key] for s in shards], rule), value), key


def test_shard_rules_name_megatron_parallel_layers():
    assert shard_rule("decoder.layers.0.self_attention.linear_qkv.weight") == "dim0"
    assert shard_rule("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight") == "replicated"
    assert shard_rule("decoder.layers.0.mlp.linear_fc1.weight") == "glu"
    assert shard_rule("decoder.layers.0.mlp.linear_fc2.weight") == "dim1"
    assert shard_rule("output_layer.weight") == "dim0"
    assert shard_rule("decoder.final_layernorm.weight") == "replicated"


def test_a_size_that_does_not_split_the_model_is_refused(make_config):
    config = make_config("qwen2")  # 4 heads, 2 query groups, MLP 64, vocabulary 64
    check_tensor_parallel_fits(config, 2, "k")
    with pytest.raises(ValueError, match=r"k=4: .*\{'num_key_value_heads': 2\}, not divisible by 4"):
        check_tensor_parallel_fits(config, 4, "k")
