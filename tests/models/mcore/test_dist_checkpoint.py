"""Tests for verl.models.mcore.dist_checkpoint: megatron-core ``torch_dist`` checkpoints written and read on this
machine's device (on CPU through the plain file writer), the Hugging Face converter, and a mismatch named."""

from __future__ import annotations

import json

import pytest
import torch

from verl.models.mcore import build_gpt_model, load_hf_weights_into_mcore
from verl.models.mcore.dist_checkpoint import load_dist_checkpoint, main, save_dist_checkpoint

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def assert_same_weights(want: torch.nn.Module, got: torch.nn.Module) -> None:
    for (name, a), (_, b) in zip(want.state_dict().items(), got.state_dict().items(), strict=True):
        if torch.is_tensor(a) and "_extra_state" not in name:
            assert torch.equal(a, b.to(a.dtype)), name


@pytest.mark.parametrize("prefix", ["", "module."])
def test_round_trip_restores_every_weight(make_config, tmp_path, prefix):
    config = make_config("qwen2")
    saved = build_gpt_model(config, torch.float32, DEVICE, seed=1)
    target = build_gpt_model(config, torch.float32, DEVICE, seed=2)  # different weights before loading
    assert not torch.equal(saved.embedding.word_embeddings.weight, target.embedding.word_embeddings.weight)
    save_dist_checkpoint(saved, tmp_path / "ckpt", prefix=prefix)
    # megatron-core's own format: its metadata file names the torch_dist backend, the shards are DCP files
    metadata = json.loads((tmp_path / "ckpt" / "metadata.json").read_text())
    assert metadata["sharded_backend"] == "torch_dist"
    assert (tmp_path / "ckpt" / ".metadata").is_file() and list((tmp_path / "ckpt").glob("*.distcp"))
    load_dist_checkpoint(target, tmp_path / "ckpt", prefix=prefix)
    assert_same_weights(saved, target)


def test_the_converter_writes_the_hugging_face_weights(make_config, tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf_model = AutoModelForCausalLM.from_config(make_config("llama"))
    hf_model.save_pretrained(tmp_path / "hf")
    main(["--hf_model_path", str(tmp_path / "hf"), "--output_path", str(tmp_path / "mcore"), "--dtype", "float32"])
    # what the worker does with use_dist_checkpointing=false: convert the HF weights in memory
    want = build_gpt_model(hf_model.config, torch.float32, DEVICE, seed=1)
    load_hf_weights_into_mcore(want, hf_model.state_dict(), hf_model.config)
    got = build_gpt_model(hf_model.config, torch.float32, DEVICE, seed=2)
    load_dist_checkpoint(got, tmp_path / "mcore")
    assert_same_weights(want, got)


def test_a_bf16_checkpoint_loads_into_an_fp32_model_rounded_once(make_config, tmp_path):
    config = make_config("qwen2")
    saved = build_gpt_model(config, torch.bfloat16, DEVICE, seed=1)
    save_dist_checkpoint(saved, tmp_path / "ckpt")
    target = build_gpt_model(config, torch.float32, DEVICE, seed=2)
    load_dist_checkpoint(target, tmp_path / "ckpt")
    assert target.embedding.word_embeddings.weight.dtype == torch.float32
    assert_same_weights(saved, target)  # bf16 -> fp32 is exact, so the values compare equal in bf16


def test_a_value_model_skips_the_lm_head(make_config, tmp_path):
    config = make_config("qwen2")
    save_dist_checkpoint(build_gpt_model(config, torch.float32, DEVICE, seed=1), tmp_path / "ckpt")
    critic = build_gpt_model(config, torch.float32, DEVICE, seed=2)
    head = critic.output_layer.weight.detach().clone()
    load_dist_checkpoint(critic, tmp_path / "ckpt", is_value_model=True)
    assert torch.equal(critic.output_layer.weight, head)  # left as built, for the value head to replace


def test_a_missing_checkpoint_is_named(make_config, tmp_path):
    model = build_gpt_model(make_config("qwen2"), torch.float32, DEVICE, seed=1)
    with pytest.raises(ValueError, match=r"is not a megatron-core distributed checkpoint"):
        load_dist_checkpoint(model, tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="megatron-core's own torch_dist writer needs CUDA")
def test_megatron_cores_writer_and_the_cpu_writer_write_the_same_checkpoint(make_config, tmp_path):
    from megatron.core import dist_checkpointing

    from verl.models.mcore.dist_checkpoint import cpu_save_strategy

    config = make_config("qwen2")
    saved = build_gpt_model(config, torch.float32, "cuda", seed=1)
    save_dist_checkpoint(saved, tmp_path / "own")  # on CUDA: megatron-core's default strategy
    (tmp_path / "cpu").mkdir()
    dist_checkpointing.save(saved.sharded_state_dict(), str(tmp_path / "cpu"), sharded_strategy=cpu_save_strategy())
    for name in ("own", "cpu"):
        target = build_gpt_model(config, torch.float32, "cuda", seed=2)
        load_dist_checkpoint(target, tmp_path / name)
        assert_same_weights(saved, target)
