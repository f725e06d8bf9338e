"""The lean decode step (``verl.models.llama_decode``) and the cached HF decoder on CUDA, against transformers.

Each decoder is fed the same fixed tokens after left-padded prompts (rows leave the batch mid-way, as finished rows
do in the rollout), and every step's logits are compared with one ``transformers`` forward pass over the whole
sequence, under the same autocast. On CUDA the two decoders take paths the CPU never does: the lean step keeps the
projections unfused, the HF decoder hands attention to transformers' own SDPA function (the grouped-query shortcut
is CPU-only), and SDPA picks CUDA kernels. The CPU variants (fp32, bf16) check the checks themselves.
"""

import pytest
import torch
import transformers

from tests.special_gpu.checks import (
    DTYPES,
    NEEDS_CUDA,
    autocast_factory,
    decode_fixed_tokens,
    half_precision_bound,
    max_abs_difference,
    reference_step_logits,
)
from tests.workers.rollout.conftest import decoding_prompts, sampling_options
from verl.models.llama_decode import LlamaFamilyDecoder, supports_llama_decode
from verl.workers.rollout import NaiveRollout
from verl.workers.rollout.decoding import HFCachedDecoder

VOCAB, NUM_TOKENS, KEEP_AFTER = 64, 6, 2
KEEP = [0, 2, 3]  # rows 1 leaves the batch after KEEP_AFTER decode steps
ARCHS = {"qwen2": "Qwen2", "llama": "Llama", "qwen3": "Qwen3"}  # q/k/v biases; none; per-head q/k RMSNorm
# fp32: the same arithmetic in another order (fused products, another SDPA kernel), logits of order 1: ~1e-6.
FP32_BOUND = 1e-4
# half precision: both sides round every activation in their own kernels; 16 unit roundoffs of the largest logit
# (fp16: 0.8%, bf16: 6%) are far below what a wrong mask, position or cache row gives (differences of order 1).
# Measured on CPU (qwen3, logits up to 2.5): bf16 against fp32 transformers 0.025, i.e. 1% of the largest logit.
NUM_ROUNDINGS = 16


def cases(cpu: list, cuda: list) -> list:
    return [pytest.param("cpu", *c, id="-".join(["cpu", *c])) for c in cpu] + [
        pytest.param("cuda", *c, id="-".join(["cuda", *c]), marks=[pytest.mark.gpu, NEEDS_CUDA]) for c in cuda
    ]


def build_model(arch: str, device: str, attn: str = "sdpa") -> torch.nn.Module:
    """A 2-layer Llama-family model of head_dim 16 with 4 query and 2 key/value heads, seeded, in fp32."""
    prefix = ARCHS[arch]
    config = getattr(transformers, f"{prefix}Config")(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.1,
        pad_token_id=0,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    return getattr(transformers, f"{prefix}ForCausalLM")(config).float().eval().to(device)


def fixed_tokens(device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(3, VOCAB, (4, NUM_TOKENS), generator=generator).to(device)


def transformers_steps(model, prompts, tokens, autocast) -> list[torch.Tensor]:
    """The logits every decode step must give: one plain transformers forward over prompts + tokens, no cache."""
    from tests.special_gpu.checks import append_tokens

    input_ids, attention_mask, position_ids = append_tokens(prompts, tokens)
    with torch.no_grad(), autocast():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    keep = torch.tensor(KEEP, device=tokens.device)
    return reference_step_logits(logits, prompts.batch["input_ids"].shape[1], KEEP_AFTER, keep)


def run_decoder(decoder, prompts, tokens) -> list[torch.Tensor]:
    keep = torch.tensor(KEEP, device=tokens.device)
    with torch.no_grad():
        return decode_fixed_tokens(decoder, prompts, tokens, KEEP_AFTER, keep)


def check_against_transformers(make_decoder, model, device, dtype_name, figure, name) -> None:
    dtype = DTYPES[dtype_name]
    autocast = autocast_factory(device, dtype)
    prompts, tokens = decoding_prompts().to(device), fixed_tokens(device)
    got = run_decoder(make_decoder(model, autocast), prompts, tokens)
    want = transformers_steps(model, prompts, tokens, autocast)
    assert [g.shape[0] for g in got] == [4, 4, 4, 3, 3, 3, 3]  # row 1 left after step 2
    assert all(g.dtype == torch.float32 and g.device.type == device for g in got)
    difference = figure(f"{name}_max_abs_logit_diff", max_abs_difference(got, want))
    if dtype == torch.float32:
        assert difference <= FP32_BOUND, f"{difference} > {FP32_BOUND}"
        return
    bound = half_precision_bound(torch.cat(want), dtype, NUM_ROUNDINGS)
    assert difference <= bound, f"{difference} > {bound}"
    # the decoder really computed in half precision, and stayed within its rounding of the fp32 logits
    fp32_difference = max_abs_difference(
        got, transformers_steps(model, prompts, tokens, autocast_factory(device, torch.float32))
    )
    assert 0 < fp32_difference <= bound, f"{fp32_difference} not in (0, {bound}]"


LEAN_CASES = cases(
    cpu=[("qwen2", "float32"), ("qwen3", "bfloat16")],
    cuda=[(arch, dtype) for arch in ARCHS for dtype in ("float32", "float16", "bfloat16")],
)


@pytest.mark.parametrize(("device", "arch", "dtype"), LEAN_CASES)
def test_lean_decode_step_gives_the_logits_of_transformers(device, arch, dtype, figure):
    model = build_model(arch, device)
    assert supports_llama_decode(model)
    check_against_transformers(LlamaFamilyDecoder, model, device, dtype, figure, "lean")


@pytest.mark.parametrize(("device", "arch", "dtype"), cases(cpu=[], cuda=[("qwen2", "float32"), ("qwen2", "bfloat16")]))
def test_lean_decode_step_with_fused_projections_gives_the_logits_of_transformers(device, arch, dtype, figure):
    # CUDA keeps the projections unfused by default; the fused products (the CPU default) must be right there too
    def fused(model, autocast):
        return LlamaFamilyDecoder(model, autocast, fuse_projections=True)

    check_against_transformers(fused, build_model(arch, device), device, dtype, figure, "lean_fused")


HF_CASES = cases(
    cpu=[("sdpa", "float32")],
    cuda=[(attn, dtype) for attn in ("sdpa", "eager") for dtype in ("float32", "float16", "bfloat16")],
)


@pytest.mark.parametrize(("device", "attn", "dtype"), HF_CASES)
def test_cached_hf_decoder_gives_the_logits_of_transformers(device, attn, dtype, figure):
    model = build_model("qwen2", device, attn)
    check_against_transformers(HFCachedDecoder, model, device, dtype, figure, f"hf_{attn}")
    # the decoder switched an sdpa model to its own attention for the call only
    assert model.config._attn_implementation == attn


@pytest.mark.parametrize("device", cases(cpu=[()], cuda=[()]))
def test_greedy_rollouts_on_the_lean_and_the_hf_decoder_are_identical(device, figure):
    model = build_model("qwen2", device)
    config = sampling_options(response_length=8, n=2, do_sample=False, seed=3)
    eos_ids = [1, 2]
    outputs = [
        NaiveRollout(decoder, config, 0, eos_ids).generate_sequences(decoding_prompts().to(device)).batch
        for decoder in (LlamaFamilyDecoder(model), HFCachedDecoder(model))
    ]
    lean, hf = outputs
    assert lean["responses"].device.type == device
    assert torch.equal(lean["responses"], hf["responses"])
    mask = lean["response_mask"].bool()
    difference = figure(
        "rollout_log_prob_max_abs_diff", float((lean["rollout_log_probs"] - hf["rollout_log_probs"])[mask].abs().max())
    )
    assert difference <= FP32_BOUND
