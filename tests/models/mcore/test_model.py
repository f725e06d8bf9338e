"""Tests for verl.models.mcore.model: GPTModel build, mask, logits equal to Hugging Face's, fp16 on CPU."""

from __future__ import annotations

import pytest
import torch
from megatron.core.models.gpt import GPTModel
from transformers import LlamaForCausalLM, Qwen2ForCausalLM

from verl.models.mcore import (
    PortableRotaryEmbedding,
    build_attention_mask,
    build_gpt_model,
    forward_logits,
    load_hf_weights_into_mcore,
    make_logits_fn,
)

HF_CLASSES = {"qwen2": Qwen2ForCausalLM, "llama": LlamaForCausalLM}


def _batch():
    """Row 0 left-padded by 3, row 1 right-padded by 2, row 2 unpadded; positions as the shared contract has them."""
    torch.manual_seed(3)
    input_ids = torch.randint(0, 64, (3, 9))
    attention_mask = torch.ones(3, 9, dtype=torch.long)
    attention_mask[0, :3] = 0
    attention_mask[1, 7:] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def _pair(make_config, arch, tie):
    hf_config = make_config(arch, tie=tie)
    torch.manual_seed(0)
    hf = HF_CLASSES[arch](hf_config).eval()
    model = build_gpt_model(hf_config, seed=1)
    model.eval()
    load_hf_weights_into_mcore(model, hf)
    return hf, model


def test_build_attention_mask_by_hand():
    # one row "pad, a, b": key 0 is padding; query 0 (a pad) may still see itself
    mask = build_attention_mask(torch.tensor([[0, 1, 1]]))
    expected_masked = torch.tensor([[False, True, True], [True, False, True], [True, False, False]])
    assert mask.shape == (1, 1, 3, 3)
    assert torch.equal(mask[0, 0], expected_masked)


def test_build_gpt_model_shape(make_config):
    model = build_gpt_model(make_config("qwen2", tie=True))
    assert isinstance(model, GPTModel)
    assert isinstance(model.rotary_pos_emb, PortableRotaryEmbedding)
    assert model.share_embeddings_and_output_weights is True
    assert model.embedding.word_embeddings.weight.shape == (64, 32)
    assert model.rotary_pos_emb.inv_freq.shape == (4,)  # head_dim 8 / 2


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("tie", [True, False])
def test_logits_match_hugging_face_with_padding(make_config, arch, tie):
    hf, model = _pair(make_config, arch, tie)
    input_ids, attention_mask, position_ids = _batch()
    with torch.no_grad():
        ours = forward_logits(model, input_ids, attention_mask, position_ids)
        ref = hf(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    assert ours.shape == (3, 9, 64) and ours.dtype == torch.float32
    assert torch.isfinite(ours).all()  # pad rows too: left-pad queries attend to themselves
    real = attention_mask.bool()
    assert (ours - ref).abs()[real].max().item() < 1e-4


def test_left_padding_does_not_change_real_token_logits(make_config):
    _, model = _pair(make_config, "qwen2", tie=False)
    input_ids, attention_mask, position_ids = _batch()
    fn = make_logits_fn(model)
    with torch.no_grad():
        padded = fn(input_ids, attention_mask, position_ids)[0, 3:]
        alone = fn(input_ids[:1, 3:], attention_mask[:1, 3:], position_ids[:1, 3:])[0]
        direct = forward_logits(model, input_ids, attention_mask, position_ids)
    # RoPE is relative: a 3-token left shift must not move the real tokens' logits
    assert (padded - alone).abs().max().item() < 1e-5
    assert torch.equal(fn(input_ids, attention_mask, position_ids), direct)


def test_fp16_forward_backward_on_cpu(make_config):
    model = build_gpt_model(make_config("qwen2", tie=True), dtype=torch.float16, seed=0)
    assert {p.dtype for p in model.parameters()} == {torch.float16}  # norms included
    input_ids, attention_mask, position_ids = _batch()
    logits = forward_logits(model, input_ids, attention_mask, position_ids, fp32=False)
    assert logits.dtype == torch.float16
    log_probs = torch.log_softmax(logits.float(), dim=-1).gather(-1, input_ids[..., None]).squeeze(-1)
    loss = -log_probs[attention_mask.bool()].mean()
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is not None for g in grads.values())
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert grads["embedding.word_embeddings.weight"].abs().sum() > 0


def test_cuda_device_without_cuda_is_rejected(make_config):
    if torch.cuda.is_available():
        pytest.skip("this check is about machines without CUDA")
    with pytest.raises(ValueError, match="CUDA is not available"):
        build_gpt_model(make_config("qwen2"), device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["auto", "portable"])
def test_logits_match_hugging_face_on_gpu(make_config, backend):
    hf_config = make_config("qwen2", tie=True)
    torch.manual_seed(0)
    hf = Qwen2ForCausalLM(hf_config).eval().cuda()
    model = build_gpt_model(hf_config, device="cuda", spec_backend=backend, seed=1)
    model.eval()
    load_hf_weights_into_mcore(model, hf)
    input_ids, attention_mask, position_ids = (t.cuda() for t in _batch())
    with torch.no_grad():
        ours = forward_logits(model, input_ids, attention_mask, position_ids)
        ref = hf(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    assert (ours - ref).abs()[attention_mask.bool()].max().item() < 1e-3
