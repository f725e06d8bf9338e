"""The lean decode step against transformers' own forward pass, for every model type it claims."""

import pytest
import torch

from tests.workers.rollout.conftest import (
    PAD_ID,
    VOCAB_SIZE,
    build_tiny_model,
    decoding_prompts,
    make_prompts,
    step_logits,
)
from verl.models.llama_decode import LlamaFamilyDecoder, supports_llama_decode
from verl.workers.rollout import NaiveRollout
from verl.workers.rollout.decoding import HFCachedDecoder


def build(model_type: str, **overrides):
    model = build_tiny_model(model_type, **overrides)
    model.config._attn_implementation = "sdpa"
    return model


CASES = {
    "qwen2": {},  # q/k/v biases
    "llama": {},
    "llama-biases-rope-scaling": {
        "attention_bias": True,
        "mlp_bias": True,
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    },
    "mistral": {"sliding_window": None},
    "qwen3": {"head_dim": 8},  # per-head q/k RMSNorm
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_decode_step_gives_the_logits_of_transformers(case):
    model = build(case.split("-")[0], **CASES[case])
    assert supports_llama_decode(model)
    prompts = decoding_prompts()
    with torch.no_grad():
        lean = step_logits(LlamaFamilyDecoder(model), prompts, num_steps=6, drop_after=2)
        reference = step_logits(HFCachedDecoder(model), prompts, num_steps=6, drop_after=2)
    assert [x.shape[0] for x in lean] == [4, 4, 4, 3, 3, 3, 3]  # rows left the batch after step 2
    for step, (a, b) in enumerate(zip(lean, reference, strict=True)):
        # fp32, logits of order 10: only the order of additions differs (fused products), ~1e-6
        assert torch.allclose(a, b, atol=1e-5, rtol=0), f"step {step}: {(a - b).abs().max().item()}"


def test_under_fp16_autocast_the_step_follows_transformers_within_fp16_rounding():
    model = build("qwen2")
    prompts = decoding_prompts()

    def fp16():
        return torch.autocast("cpu", dtype=torch.float16)

    with torch.no_grad():
        lean = step_logits(LlamaFamilyDecoder(model, fp16), prompts, num_steps=3, drop_after=1)
        reference = step_logits(HFCachedDecoder(model, fp16), prompts, num_steps=3, drop_after=1)
    for a, b in zip(lean[1:], reference[1:], strict=True):
        assert a.dtype == b.dtype == torch.float32  # the decoders' contract, whatever the compute precision
        # fp16 products keep ~3 significant digits: logits of order 10 round to ~1e-2, summed in another order
        assert torch.allclose(a, b, atol=0.1, rtol=0)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_a_seeded_rollout_samples_the_same_tokens_on_both_decoders():
    model = build("qwen2")
    prompts = make_prompts([[5, 6], [7, 8, 9, 10], [11, 12, 13, 14, 15]], num_prompt_tokens=5)
    config = {"response_length": 10, "n": 4, "seed": 5, "temperature": 1.0}
    eos_ids = [1, 2, 3, 4, 6]

    def sample(decoder):
        return NaiveRollout(decoder, config, PAD_ID, eos_ids).generate_sequences(prompts).batch

    lean, reference = sample(LlamaFamilyDecoder(model)), sample(HFCachedDecoder(model))
    lengths = lean["response_mask"].sum(-1)
    assert lengths.min() < lengths.max()  # rows ended at different steps and left the batch
    assert torch.equal(lean["responses"], reference["responses"])
    mask = lean["response_mask"].bool()
    assert torch.allclose(lean["rollout_log_probs"][mask], reference["rollout_log_probs"][mask], atol=1e-5, rtol=0)


def test_fused_weights_are_taken_at_prefill_and_dropped_on_release():
    model = build("llama")
    decoder = LlamaFamilyDecoder(model)
    prompts = decoding_prompts()
    with torch.no_grad():
        before = step_logits(decoder, prompts, num_steps=1, drop_after=-1)
        decoder.release()
        assert decoder._layers is None and model.config._attn_implementation == "sdpa"
        # training changes the weights between generate calls: the next call must decode with the new ones
        model.model.layers[0].mlp.up_proj.weight.mul_(2.0)
        after = step_logits(decoder, prompts, num_steps=1, drop_after=-1)
        reference = step_logits(HFCachedDecoder(model), prompts, num_steps=1, drop_after=-1)
    assert not torch.allclose(before[1], after[1])
    assert torch.allclose(after[1], reference[1], atol=1e-5, rtol=0)


class _Sharded(torch.Tensor):
    """Stands in for a sharded parameter (FSDP2's are DTensors): not a plain tensor."""


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB_SIZE, n_embd=32, n_layer=2, n_head=4, n_positions=64))


@pytest.mark.parametrize(
    "make_model, why",
    [
        (lambda: build("mistral", sliding_window=4), "sliding-window attention"),
        (lambda: build("llama", hidden_act="gelu"), "another activation"),
        (_gpt2, "another architecture"),
    ],
    ids=["sliding-window", "gelu", "gpt2"],
)
def test_models_it_cannot_decode_stay_with_transformers(make_model, why):
    model = make_model()
    assert not supports_llama_decode(model), why
    with pytest.raises(ValueError, match="use HFCachedDecoder"):
        LlamaFamilyDecoder(model)


def test_a_model_with_sharded_parameters_stays_with_transformers():
    model = build("qwen2")
    head = model.lm_head
    head.weight = torch.nn.Parameter(head.weight.detach().clone().as_subclass(_Sharded))
    assert not supports_llama_decode(model)


def test_the_dp_actor_decodes_llama_family_models_on_the_lean_step():
    from tests.workers.actor.conftest import actor_config
    from verl.workers.actor.dp_actor import build_dp_actor

    lean = build_dp_actor(actor_config(), build("qwen2"), total_training_steps=1)
    other = build_dp_actor(actor_config(), _gpt2(), total_training_steps=1)
    assert type(lean.incremental_decoder()) is LlamaFamilyDecoder
    assert type(other.incremental_decoder()) is HFCachedDecoder
