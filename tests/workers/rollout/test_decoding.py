"""The incremental decoders against a full recompute: same logits per step, rows leaving the batch included."""

import pytest
import torch

from tests.tolerances import logits_tolerance
from verl.workers.rollout import NaiveRollout
from verl.workers.rollout.decoding import HFCachedDecoder, PreallocatedCacheLayer, RecomputeDecoder

from .conftest import PAD_ID, decoding_prompts, hf_logits_fn, make_prompts, sampling_options, step_logits


def test_hf_cached_decoder_gives_the_recomputed_logits(tiny_model):
    prompts = decoding_prompts()
    with torch.no_grad():
        cached = step_logits(HFCachedDecoder(tiny_model), prompts, num_steps=6, drop_after=2)
        full = step_logits(RecomputeDecoder(hf_logits_fn(tiny_model)), prompts, num_steps=6, drop_after=2)
    assert [c.shape[0] for c in cached] == [4, 4, 4, 3, 3, 3, 3]
    for step, (a, b) in enumerate(zip(cached, full, strict=True)):
        # fp32: the cache changes only the order of additions, so the logits agree within the reordering bound of
        # their reduction chain relative to their size (tests.tolerances: 4.4e-4 on logits up to 6.3 at step 5,
        # where one machine measured 1.14e-5 and another 8.5e-6); step 0 is the prefill over 5 prompt positions
        tol = logits_tolerance(b, tiny_model.config, num_positions=5 + step)
        assert torch.allclose(a, b, atol=tol, rtol=0), f"step {step}: {(a - b).abs().max().item()} > {tol}"


def test_the_cache_is_written_in_place_and_refuses_tokens_past_its_capacity():
    layer = PreallocatedCacheLayer(capacity=3)
    keys = torch.randn(2, 1, 2, 4)
    out_keys, _ = layer.update(keys, keys.clone())
    buffer = layer._key_buffer
    layer.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))
    assert layer._key_buffer is buffer and layer.get_seq_length() == 3  # same storage, no concatenation
    assert torch.equal(layer.keys[:, :, :2], keys) and torch.equal(layer.keys[:, :, 2], torch.ones(2, 1, 4))
    layer.batch_select_indices(torch.tensor([1]))
    assert layer.keys.shape == (1, 1, 3, 4) and torch.equal(layer.keys[0, :, :2], keys[1])
    with pytest.raises(ValueError, match="holds 3 tokens per row; 4 were asked for"):
        layer.update(torch.ones(1, 1, 1, 4), torch.ones(1, 1, 1, 4))


def test_rollouts_on_the_cached_and_the_recomputing_decoder_agree(tiny_model):
    """Seeded sampling with several eos ids, so that rows end at different steps and leave the batch."""
    prompts = make_prompts([[5, 6], [7, 8, 9, 10], [11, 12, 13, 14, 15]], num_prompt_tokens=5)
    config = sampling_options(response_length=10, n=4, seed=5, temperature=1.0)
    eos_ids = [1, 2, 3, 4, 6]

    def sample(model):
        return NaiveRollout(model, config, PAD_ID, eos_ids).generate_sequences(prompts).batch

    with torch.no_grad():
        cached = sample(HFCachedDecoder(tiny_model))
        full = sample(hf_logits_fn(tiny_model))
    lengths = cached["response_mask"].sum(-1)
    assert lengths.min() < lengths.max()  # rows did end at different steps
    assert torch.equal(cached["responses"], full["responses"])
    mask = cached["response_mask"].bool()
    # a log-prob is a logit minus the log-sum-exp of its row: each within the logits' bound, so twice that bound
    with torch.no_grad():
        logits = hf_logits_fn(tiny_model)(cached["input_ids"], cached["attention_mask"], cached["position_ids"])
    tol = 2 * logits_tolerance(logits[cached["attention_mask"].bool()], tiny_model.config, cached["input_ids"].shape[1])
    assert torch.allclose(cached["rollout_log_probs"][mask], full["rollout_log_probs"][mask], atol=tol, rtol=0)


def test_an_sdpa_model_decodes_on_grouped_query_attention_and_gets_its_own_back(tiny_model, monkeypatch):
    """The switch lasts from prefill to release; a rollout releases even when the model fails mid-way."""
    from transformers import AttentionInterface

    from verl.workers.rollout import decoding

    calls = []

    def counting(*args, **kwargs):
        calls.append(args[1].shape)  # the query
        return decoding.grouped_query_sdpa_attention(*args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, decoding.GROUPED_QUERY_SDPA, counting)
    tiny_model.config._attn_implementation = "sdpa"
    prompts = decoding_prompts()
    decoder = HFCachedDecoder(tiny_model)
    with torch.no_grad():
        step_logits(decoder, prompts, num_steps=2, drop_after=0)
    assert tiny_model.config._attn_implementation == decoding.GROUPED_QUERY_SDPA
    # 2 layers x (prefill + 2 decode steps); decode queries are one token per row
    assert len(calls) == 6 and calls[-1][2] == 1
    decoder.release()
    assert tiny_model.config._attn_implementation == "sdpa"

    def failing(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setitem(AttentionInterface._global_mapping, decoding.GROUPED_QUERY_SDPA, failing)
    rollout = NaiveRollout(HFCachedDecoder(tiny_model), sampling_options(response_length=2), PAD_ID, 2)
    with pytest.raises(RuntimeError, match="boom"):
        rollout.generate_sequences(prompts)
    assert tiny_model.config._attn_implementation == "sdpa"
