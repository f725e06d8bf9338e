"""Tests for verl.models.mcore.dist_checkpoint: refused without CUDA by message; a round trip on CUDA."""

from __future__ import annotations

import pytest
import torch

from verl.models.mcore import build_gpt_model
from verl.models.mcore.dist_checkpoint import load_dist_checkpoint, main, save_dist_checkpoint


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_without_cuda_each_entry_point_says_it_needs_cuda(make_config, tmp_path):
    model = build_gpt_model(make_config("qwen2"), torch.float32, "cpu", seed=1)
    with pytest.raises(ValueError, match=r"saving a megatron-core distributed checkpoint needs CUDA"):
        save_dist_checkpoint(model, tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"loading a megatron-core distributed checkpoint needs CUDA"):
        load_dist_checkpoint(model, tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"converting a Hugging Face model .* needs CUDA"):
        main(["--hf_model_path", str(tmp_path), "--output_path", str(tmp_path / "out")])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="megatron-core's torch_dist strategy needs CUDA")
def test_round_trip_restores_every_weight_with_and_without_a_prefix(make_config, tmp_path):
    config = make_config("qwen2")
    saved = build_gpt_model(config, torch.float32, "cuda", seed=1)
    for prefix in ("", "module."):
        target = build_gpt_model(config, torch.float32, "cuda", seed=2)  # different weights before loading
        assert not torch.equal(saved.embedding.word_embeddings.weight, target.embedding.word_embeddings.weight)
        save_dist_checkpoint(saved, tmp_path / f"ckpt{prefix}", prefix=prefix)
        load_dist_checkpoint(target, tmp_path / f"ckpt{prefix}", prefix=prefix)
        for (name, want), (_, got) in zip(saved.state_dict().items(), target.state_dict().items(), strict=True):
            if torch.is_tensor(want) and "_extra_state" not in name:
                assert torch.equal(want, got), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="megatron-core's torch_dist strategy needs CUDA")
def test_a_missing_checkpoint_is_named(make_config, tmp_path):
    model = build_gpt_model(make_config("qwen2"), torch.float32, "cuda", seed=1)
    with pytest.raises(ValueError, match=r"is not a megatron-core distributed checkpoint"):
        load_dist_checkpoint(model, tmp_path)
