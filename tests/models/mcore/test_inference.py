"""megatron-core's static inference context as the naive rollout's key/value cache, against a full recompute."""

import torch

from tests.tolerances import fp16_logits_tolerance, logits_tolerance
from tests.workers.rollout.conftest import sampling_options
from verl.models.mcore import build_gpt_model, make_logits_fn
from verl.models.mcore.inference import MegatronCachedDecoder
from verl.workers.rollout import NaiveRollout
from verl.workers.rollout.decoding import RecomputeDecoder


def _prompts():
    # left padding of 3, 1, 0 and 2 tokens
    ids = torch.tensor([[0, 0, 0, 5, 6], [0, 7, 8, 9, 10], [11, 12, 13, 14, 15], [0, 0, 16, 17, 18]])
    mask = (ids != 0).long()
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


NUM_PROMPT_TOKENS = 5


def _model(make_config):
    return build_gpt_model(make_config("qwen2"), torch.float32, "cpu", seed=3).eval()


def _assert_close(a, b, config, num_positions, tolerance=logits_tolerance):
    """Within the bound of ``tests.tolerances`` for another order of additions (a cache instead of a recompute)."""
    tol = tolerance(b, config, num_positions)
    assert torch.allclose(a, b, atol=tol, rtol=0), f"{(a - b).abs().max().item()} > {tol}"


def test_cached_decoding_gives_the_recomputed_logits(make_config):
    config = make_config("qwen2")
    model = _model(make_config)
    ids, mask, positions = _prompts()
    cached, full = MegatronCachedDecoder(model, kv_dtype=torch.float32), RecomputeDecoder(make_logits_fn(model))
    with torch.no_grad():
        a, b = cached.prefill(ids, mask, positions, 5), full.prefill(ids, mask, positions, 5)
        _assert_close(a, b, config, NUM_PROMPT_TOKENS)
        next_position = positions[:, -1] + 1
        for step in range(5):
            tokens = b.argmax(-1)
            if step == 1:  # row 1 ends: its cache rows go
                keep = torch.tensor([0, 2, 3])
                cached.keep_rows(keep)
                full.keep_rows(keep)
                tokens, mask, next_position = tokens[keep], mask[keep], next_position[keep]
            mask = torch.cat([mask, torch.ones(mask.shape[0], 1, dtype=mask.dtype)], dim=-1)
            a, b = cached.decode(tokens, mask, next_position), full.decode(tokens, mask, next_position)
            assert a.shape == (4 if step == 0 else 3, 64)
            _assert_close(a, b, config, NUM_PROMPT_TOKENS + step + 1)
            next_position = next_position + 1
    # the cache was cut to the rows still generating
    keys, _ = cached._context.key_value_memory_dict[1]
    assert keys.shape[1] == 3


def test_naive_rollout_samples_the_same_on_the_cache(make_config):
    model = _model(make_config)
    ids, mask, positions = _prompts()
    config = sampling_options(response_length=8, n=3, seed=11, temperature=1.0)
    eos_ids = list(range(1, 12))  # a sixth of the vocabulary ends a row: rows stop at different steps
    from verl.protocol import DataProto

    prompts = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": positions})

    def sample(decoder):
        return NaiveRollout(decoder, config, 0, eos_ids).generate_sequences(prompts).batch

    with torch.no_grad():
        cached = sample(MegatronCachedDecoder(model, kv_dtype=torch.float32))
        full = sample(make_logits_fn(model))
    lengths = cached["response_mask"].sum(-1)
    assert lengths.min() < lengths.max()
    assert torch.equal(cached["responses"], full["responses"])
    real = cached["response_mask"].bool()
    # a log-prob is a logit minus the log-sum-exp of its row: each within the logits' bound, so twice that bound
    with torch.no_grad():
        logits = make_logits_fn(model)(cached["input_ids"], cached["attention_mask"], cached["position_ids"])
    num_positions = cached["input_ids"].shape[1]
    tol = 2 * logits_tolerance(logits[cached["attention_mask"].bool()], make_config("qwen2"), num_positions)
    assert torch.allclose(cached["rollout_log_probs"][real], full["rollout_log_probs"][real], atol=tol, rtol=0)


def test_cached_decoding_under_fp16_autocast_tracks_the_recompute(make_config):
    """The actor's CPU fp16 path: weights fp32, forward under autocast, keys cached in fp16."""
    model = _model(make_config)
    ids, mask, positions = _prompts()

    def autocast():
        return torch.autocast("cpu", dtype=torch.float16)

    def logits_fn(*args):
        with autocast():
            return make_logits_fn(model)(*args)

    cached = MegatronCachedDecoder(model, kv_dtype=torch.float16, autocast=autocast)
    full = RecomputeDecoder(logits_fn)
    with torch.no_grad():
        a, b = cached.prefill(ids, mask, positions, 2), full.prefill(ids, mask, positions, 2)
        tokens = b.argmax(-1)
        mask = torch.cat([mask, torch.ones(4, 1, dtype=mask.dtype)], dim=-1)
        a = cached.decode(tokens, mask, positions[:, -1] + 1)
        b = full.decode(tokens, mask, positions[:, -1] + 1)
    assert cached._context.key_value_memory_dict[1][0].dtype == torch.float16
    assert torch.isfinite(a).all()
    # both run the same fp16 operations in another order of fp32 accumulation, which can tip each fp16 rounding on a
    # logit's path by one unit (tests.tolerances.fp16_logits_tolerance)
    _assert_close(a, b, make_config("qwen2"), NUM_PROMPT_TOKENS + 1, fp16_logits_tolerance)
