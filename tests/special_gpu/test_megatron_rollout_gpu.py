"""The megatron naive rollout on CUDA: megatron-core's static inference context as the key/value cache.

On CUDA a GPTModel takes megatron-core's own ``local`` layer spec (its ``DotProductAttention``, its rotary module)
instead of the portable one the CPU runs, so the cached decoding (``MegatronCachedDecoder``) meets code it never
met on CPU. Checked: every step's logits against one ``transformers`` forward over the whole sequence (fp32 and
bf16 parameters), and the naive rollout through the actor's own decoder on the GPU training path (megatron-core
DDP, fp16 parameters), as the worker runs it: model in eval mode, every greedy token the full forward's argmax up
to rounding, and the rollout's log-probs equal to the actor's ``compute_log_prob`` within fp16 rounding. The CPU
variants run the portable spec (fp32).
"""

import pytest
import torch
import transformers

from tests.special_gpu.checks import (
    DTYPES,
    NEEDS_CUDA,
    append_tokens,
    decode_fixed_tokens,
    half_precision_bound,
    max_abs_difference,
    reference_step_logits,
)
from tests.workers.actor.conftest import actor_config, megatron_world_of_one  # noqa: F401
from tests.workers.rollout.conftest import decoding_prompts, sampling_options
from verl.models.mcore import build_gpt_model, load_hf_weights_into_mcore
from verl.models.mcore.inference import MegatronCachedDecoder
from verl.workers.rollout import NaiveRollout
from verl.workers.rollout.decoding import RecomputeDecoder

pytestmark = pytest.mark.usefixtures("megatron_world_of_one")

VOCAB, NUM_TOKENS, KEEP_AFTER, KEEP = 64, 6, 2, [0, 2, 3]
FP32_BOUND = 1e-4  # same arithmetic, other kernels: ~1e-6 on logits of order 1
NUM_ROUNDINGS = 16  # see test_decode_gpu.py


def cases(cpu: list, cuda: list) -> list:
    return [pytest.param("cpu", *c, id="-".join(["cpu", *c])) for c in cpu] + [
        pytest.param("cuda", *c, id="-".join(["cuda", *c]), marks=[pytest.mark.gpu, NEEDS_CUDA]) for c in cuda
    ]


def hf_model(device: str) -> torch.nn.Module:
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.1,
        tie_word_embeddings=True,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config).float().eval().to(device)


@pytest.mark.parametrize(("device", "dtype"), cases(cpu=[("float32",)], cuda=[("float32",), ("bfloat16",)]))
def test_cached_decoding_on_the_static_context_gives_the_logits_of_transformers(device, dtype, figure):
    lm = hf_model(device)
    model = build_gpt_model(lm.config, DTYPES[dtype], device, seed=1)
    load_hf_weights_into_mcore(model, lm.state_dict(), lm.config)
    model.eval()
    prompts = decoding_prompts().to(device)
    tokens = torch.randint(3, VOCAB, (4, NUM_TOKENS), generator=torch.Generator().manual_seed(1)).to(device)
    keep = torch.tensor(KEEP, device=device)
    with torch.no_grad():
        got = decode_fixed_tokens(
            MegatronCachedDecoder(model, kv_dtype=DTYPES[dtype]), prompts, tokens, KEEP_AFTER, keep
        )
        input_ids, attention_mask, position_ids = append_tokens(prompts, tokens)
        full = lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    want = reference_step_logits(full, prompts.batch["input_ids"].shape[1], KEEP_AFTER, keep)
    assert [g.shape[0] for g in got] == [4, 4, 4, 3, 3, 3, 3]
    difference = figure("megatron_cached_max_abs_logit_diff", max_abs_difference(got, want))
    bound = FP32_BOUND if dtype == "float32" else half_precision_bound(torch.cat(want), DTYPES[dtype], NUM_ROUNDINGS)
    assert difference <= bound, f"{difference} > {bound}"


@pytest.mark.parametrize("device", cases(cpu=[()], cuda=[()]))
def test_the_naive_rollout_on_the_actor_decoder_as_the_worker_runs_it(device, figure):
    from verl.workers.actor.megatron_builder import build_megatron_actor

    lm = hf_model("cpu")
    # CUDA: the GPU training path (megatron-core DDP, fp16 parameters); CPU: the adapter path in fp32
    on_gpu = device == "cuda"
    config = actor_config(
        strategy="megatron",
        dtype="float16" if on_gpu else "float32",
        megatron={"use_megatron_optimizer": on_gpu},
        optim={"lr": 1e-2, "initial_loss_scale": 1024.0},
    )
    actor = build_megatron_actor(
        lm.config, config, device=device, total_training_steps=10, hf_state_dict=lm.state_dict()
    )
    assert actor.training_path.startswith("GPU path" if on_gpu else "CPU path")
    options = sampling_options(response_length=8, n=2, do_sample=False, seed=3)
    eos_ids = [1, 2]

    def recompute_logits(input_ids, attention_mask, position_ids):
        with actor.autocast():
            return actor.forward_logits(input_ids, attention_mask, position_ids).float()

    # as the worker's generate: the trained module to eval mode, sampling without gradients, then back to train
    actor.model_module().eval()
    with torch.no_grad():
        cached = NaiveRollout(actor.incremental_decoder(), options, 0, eos_ids).generate_sequences(
            decoding_prompts().to(device)
        )
        full = NaiveRollout(RecomputeDecoder(recompute_logits), options, 0, eos_ids).generate_sequences(
            decoding_prompts().to(device)
        )
    actor.model_module().train()
    real = cached.batch["response_mask"].bool()
    # every token the cached rollout picked is the full forward's argmax, up to rounding (fp16: two logits closer
    # than that may swap; in fp32 the tokens are the same)
    num_prompt = decoding_prompts().batch["input_ids"].shape[1]
    batch = cached.batch
    with torch.no_grad():
        logits = recompute_logits(batch["input_ids"], batch["attention_mask"], batch["position_ids"])
    logits = logits[:, num_prompt - 1 : -1]  # the logits each response token was picked from
    picked = logits.gather(-1, batch["responses"][..., None])[..., 0]
    gap = figure("greedy_pick_max_logit_gap", float((logits.max(-1).values - picked)[real].max()))
    assert gap <= (5e-2 if on_gpu else FP32_BOUND), gap
    if not on_gpu:
        assert torch.equal(cached.batch["responses"], full.batch["responses"])
    cached.meta_info["temperature"] = 1.0
    log_probs, _ = actor.compute_log_prob(cached)
    difference = figure(
        "rollout_vs_compute_log_prob_max_abs_diff",
        float((cached.batch["rollout_log_probs"] - log_probs)[real].abs().max()),
    )
    # fp16 parameters: the cached decode and the full forward round apart (log-probs of order 4: ~1e-2)
    bound = 5e-2 if on_gpu else FP32_BOUND
    assert difference <= bound, f"{difference} > {bound}"
    # back in train mode, the actor trains on what it sampled (a loss scale of 1024 fits: the update applies)
    cached.batch["advantages"] = real.float()
    cached.batch["old_log_probs"] = log_probs
    assert actor.update_policy(cached).metrics["actor/update_failed"] == 0.0
