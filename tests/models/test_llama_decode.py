"""The lean decode step against transformers' own forward pass, for every model type it claims, and its weights.

The reference is plain ``transformers``: ``model(input_ids, attention_mask, position_ids).logits`` over the whole
sequence so far at every step (``RecomputeDecoder`` over ``hf_logits_fn``), no cache. Tolerances come from the
arithmetic (``tests.tolerances``).
"""

import pytest
import torch

from tests.tolerances import fp16_logits_tolerance, logits_tolerance
from tests.workers.rollout.conftest import (
    PAD_ID,
    build_tiny_model,
    decoding_prompts,
    hf_logits_fn,
    make_prompts,
    sampling_options,
    step_logits,
)
from verl.models.llama_decode import LlamaFamilyDecoder, supports_llama_decode
from verl.workers.rollout import NaiveRollout
from verl.workers.rollout.decoding import HFCachedDecoder, RecomputeDecoder

NUM_PROMPT_TOKENS = 5  # decoding_prompts(): step s of step_logits attends to 5 + s positions


def build(model_type: str, **overrides):
    model = build_tiny_model(model_type, **overrides)
    model.config._attn_implementation = "sdpa"
    return model


def transformers_logits(model, prompts, num_steps, drop_after):
    """Each step's logits from transformers' forward pass over the whole sequence so far (no cache)."""
    with torch.no_grad():
        return step_logits(RecomputeDecoder(hf_logits_fn(model)), prompts, num_steps, drop_after)


def assert_steps_match(got, want, config):
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        tol = logits_tolerance(b, config, NUM_PROMPT_TOKENS + step)
        assert torch.allclose(a, b, atol=tol, rtol=0), f"step {step}: {(a - b).abs().max().item()} > {tol}"


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
    # head_dim 32 against hidden_size / heads = 16: the query is 128 wide, the output product reads 128 into 64
    "qwen3-head-dim-32": {"hidden_size": 64, "head_dim": 32},
    # scaled embedding, RMSNorm by (1 + weight), tanh GELU; one key/value head of 16
    "gemma": {"num_key_value_heads": 1, "head_dim": 16},
}


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("case", list(CASES))
def test_each_decode_step_gives_the_logits_of_transformers(case, fuse):
    model = build(case.split("-")[0], **CASES[case])
    assert supports_llama_decode(model)
    prompts = decoding_prompts()
    with torch.no_grad():
        lean = step_logits(LlamaFamilyDecoder(model, fuse_projections=fuse), prompts, num_steps=6, drop_after=2)
    assert [x.shape[0] for x in lean] == [4, 4, 4, 3, 3, 3, 3]  # rows left the batch after step 2
    assert_steps_match(lean, transformers_logits(model, prompts, num_steps=6, drop_after=2), model.config)


def test_the_qwen3_case_has_a_head_dim_of_its_own_and_q_k_norms():
    """What the ``qwen3-head-dim-32`` case above is meant to cover."""
    model = build("qwen3", **CASES["qwen3-head-dim-32"])
    config, attention = model.config, model.model.layers[0].self_attn
    assert config.head_dim == 32 != config.hidden_size // config.num_attention_heads  # 64 / 4 = 16
    assert attention.q_proj.out_features == 4 * 32 and attention.o_proj.in_features == 4 * 32
    assert attention.q_norm.weight.shape == attention.k_norm.weight.shape == (32,)


@pytest.mark.parametrize("case", ["qwen2", "qwen3-head-dim-32"])
def test_under_fp16_autocast_the_step_follows_transformers_within_fp16_rounding(case):
    model = build(case.split("-")[0], **CASES[case])
    prompts = decoding_prompts()

    def fp16():
        return torch.autocast("cpu", dtype=torch.float16)

    with torch.no_grad():
        lean = step_logits(LlamaFamilyDecoder(model, fp16), prompts, num_steps=3, drop_after=1)
        reference = step_logits(HFCachedDecoder(model, fp16), prompts, num_steps=3, drop_after=1)
    for step, (a, b) in enumerate(zip(lean[1:], reference[1:], strict=True), start=1):
        assert a.dtype == b.dtype == torch.float32  # the decoders' contract, whatever the compute precision
        # both run the same fp16 operations; only their fp32 accumulation order differs, which can tip each fp16
        # rounding on the way by one unit (see fp16_logits_tolerance). Measured on the test machine: 0.
        tol = fp16_logits_tolerance(b, model.config, NUM_PROMPT_TOKENS + step)
        assert torch.allclose(a, b, atol=tol, rtol=0), f"step {step}: {(a - b).abs().max().item()} > {tol}"
        # the greedy token agrees wherever rounding cannot swap the top two logits
        top2 = b.topk(2, dim=-1).values
        clear = top2[:, 0] - top2[:, 1] > 2 * tol
        assert clear.any() and torch.equal(a.argmax(-1)[clear], b.argmax(-1)[clear])


def test_a_seeded_rollout_samples_the_same_tokens_on_both_decoders():
    model = build("qwen2")
    prompts = make_prompts([[5, 6], [7, 8, 9, 10], [11, 12, 13, 14, 15]], num_prompt_tokens=5)
    config = sampling_options(response_length=10, n=4, seed=5, temperature=1.0)
    eos_ids = [1, 2, 3, 4, 6]

    def sample(decoder):
        with torch.no_grad():
            return NaiveRollout(decoder, config, PAD_ID, eos_ids).generate_sequences(prompts).batch

    lean, reference = sample(LlamaFamilyDecoder(model)), sample(HFCachedDecoder(model))
    lengths = lean["response_mask"].sum(-1)
    assert lengths.min() < lengths.max()  # rows ended at different steps and left the batch
    assert torch.equal(lean["responses"], reference["responses"])
    mask = lean["response_mask"].bool()
    # a log-prob is a logit minus the log-sum-exp of the row's logits: each within the logits' bound, twice it
    real = lean["attention_mask"].bool()
    with torch.no_grad():
        logits = hf_logits_fn(model)(lean["input_ids"], lean["attention_mask"], lean["position_ids"])[real]
    tol = 2 * logits_tolerance(logits, model.config, num_positions=lean["input_ids"].shape[1])
    assert torch.allclose(lean["rollout_log_probs"][mask], reference["rollout_log_probs"][mask], atol=tol, rtol=0)


def _update_in_place(model):
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(2.0)


def _update_through_data(model):
    # .data writes bypass the parameter's version counter: a cache keyed on it would miss this one
    weight = model.model.layers[1].self_attn.k_proj.weight
    weight.data.copy_(weight.data.flip(0))


def _fused_adamw_step(model):
    # torch's fused AdamW does not bump the parameters' version counters either (torch 2.13, measured)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.5, fused=True)
    ids = decoding_prompts().batch["input_ids"]
    model(input_ids=ids).logits.logsumexp(-1).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _load_state_dict(model):
    state = {
        name: tensor * 1.5 if name.endswith("v_proj.weight") else tensor for name, tensor in model.state_dict().items()
    }
    model.load_state_dict(state)


def _new_parameter(model):
    gate = model.model.layers[0].mlp.gate_proj
    gate.weight = torch.nn.Parameter(-gate.weight.detach())


UPDATES = {
    "in-place": _update_in_place,
    "through-data": _update_through_data,
    "fused-adamw-step": _fused_adamw_step,
    "load-state-dict": _load_state_dict,
    "new-parameter": _new_parameter,
}


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("update", list(UPDATES))
def test_the_next_generate_call_decodes_with_the_changed_weights(update, fuse):
    """Training changes the weights between generate calls, in every way torch offers; the next call must see it."""
    model = build("qwen2")
    decoder = LlamaFamilyDecoder(model, fuse_projections=fuse)
    prompts = decoding_prompts()
    with torch.no_grad():
        before = step_logits(decoder, prompts, num_steps=3, drop_after=-1)
        decoder.release()
    UPDATES[update](model)
    with torch.no_grad():
        after = step_logits(decoder, prompts, num_steps=3, drop_after=-1)
    assert (after[-1] - before[-1]).abs().max() > 0.1  # the update did change the logits
    assert_steps_match(after, transformers_logits(model, prompts, num_steps=3, drop_after=-1), model.config)


def test_fused_weights_live_for_one_call_and_only_when_asked():
    model = build("qwen2")  # hidden 32; 4 query heads and 2 key/value heads of 8; intermediate 64; q/k/v biases
    prompts = decoding_prompts()
    # per layer: q/k/v (32 + 16 + 16) x 32 = 2048 weights + 64 biases, gate/up (64 + 64) x 32 = 4096 weights; x 2
    # layers x 4 bytes = 49664 bytes, 66 % of the 74880 bytes of the weights outside the embedding and the LM head
    expected = 2 * (2048 + 64 + 4096) * 4
    for fuse, held in ((None, expected), (True, expected), (False, 0)):  # None: fused on CPU
        decoder = LlamaFamilyDecoder(model, fuse_projections=fuse)
        assert decoder.num_fused_bytes() == 0  # nothing before the first call
        with torch.no_grad():
            step_logits(decoder, prompts, num_steps=1, drop_after=-1)
        assert decoder.num_fused_bytes() == held
        decoder.release()
        assert decoder.num_fused_bytes() == 0 and decoder._layers is None
        assert model.config._attn_implementation == "sdpa"


def fixed_token_steps(decoder, prompts, tokens):
    """Prefill, then feed ``tokens`` (B, T) one column per step, on the prompts' device; each step's logits."""
    ids, mask, positions = (prompts.batch[key] for key in ("input_ids", "attention_mask", "position_ids"))
    logits = [decoder.prefill(ids, mask, positions, tokens.shape[1])]
    position = positions[:, -1] + 1
    for column in tokens.unbind(dim=1):
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=-1)
        logits.append(decoder.decode(column, mask, position))
        position = position + 1
    return logits


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_nothing_is_concatenated_and_the_logits_are_those_of_transformers():
    model = build("qwen3", **CASES["qwen3-head-dim-32"]).cuda()
    prompts = decoding_prompts().to("cuda")
    tokens = torch.randint(3, model.config.vocab_size, (4, 6), generator=torch.Generator().manual_seed(1)).cuda()
    decoder = LlamaFamilyDecoder(model)  # the default: fused on CPU only
    with torch.no_grad():
        lean = fixed_token_steps(decoder, prompts, tokens)
        assert decoder.num_fused_bytes() == 0  # no copy of the weights, even during the call
        reference = fixed_token_steps(RecomputeDecoder(hf_logits_fn(model)), prompts, tokens)
    # other kernels, the same fp32 arithmetic up to the order of additions: the same bound as on CPU
    assert_steps_match(lean, reference, model.config)


class _Sharded(torch.Tensor):
    """Stands in for a sharded parameter (FSDP2's are DTensors): not a plain tensor."""


def test_a_model_with_sharded_parameters_stays_with_transformers():
    model = build("qwen2")
    head = model.lm_head
    head.weight = torch.nn.Parameter(head.weight.detach().clone().as_subclass(_Sharded))
    assert not supports_llama_decode(model)
