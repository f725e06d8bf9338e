"""Tests for the naive rollout's token selection (top-k, top-p, greedy) and the engine's log-probs of its tokens."""

import math

import pytest
import torch

from verl.utils.torch_functional import compute_response_log_probs
from verl.workers.rollout import sampling
from verl.workers.rollout.sampling import (
    apply_top_k,
    apply_top_p,
    draw_categorical,
    sample_next_token,
    sample_with_log_probs,
    sampled_token_log_probs,
)

from .conftest import sampling_options

NEG_INF = float("-inf")


def test_top_k_keeps_k_largest():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    assert torch.equal(apply_top_k(logits, 2), torch.tensor([[NEG_INF, 4.0, 3.0, NEG_INF]]))
    assert torch.equal(apply_top_k(logits, 0), logits)
    assert torch.equal(apply_top_k(logits, -1), logits)


def test_top_p_keeps_smallest_set_reaching_p():
    # probabilities 0.5, 0.3, 0.2 (logits are their logs)
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3]]))
    # top_p 0.6: mass before 0.5 is 0 (keep), before 0.3 is 0.5 < 0.6 (keep), before 0.2 is 0.8 (drop)
    kept = torch.isfinite(apply_top_p(logits, 0.6))
    assert kept.tolist() == [[False, True, True]]
    # top_p 0.5: mass before 0.3 is 0.5, not below 0.5 -> only the top token
    assert torch.isfinite(apply_top_p(logits, 0.5)).tolist() == [[False, True, False]]
    # top_p 0 still keeps one token
    assert torch.isfinite(apply_top_p(logits, 0.0)).tolist() == [[False, True, False]]
    assert torch.equal(apply_top_p(logits, 1.0), logits)


def test_greedy_is_argmax_and_ignores_generator():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]], dtype=torch.float16)
    params = sampling_options(n=1, response_length=1, do_sample=False)
    assert sample_next_token(logits, params).tolist() == [1, 0]


def test_sampling_follows_filtered_distribution():
    # with top_k=2 only tokens 1 and 2 can be drawn; at temperature 1 their odds are e^1 : 1
    logits = torch.tensor([[0.0, 2.0, 1.0, -5.0]]).repeat(4000, 1)
    params = sampling_options(n=1, response_length=1, top_k=2, temperature=1.0, top_p=1.0)
    draws = sample_next_token(logits, params, torch.Generator().manual_seed(0))
    assert set(draws.unique().tolist()) <= {1, 2}
    share_of_token_1 = (draws == 1).float().mean().item()
    expected = math.e / (math.e + 1)  # 0.731
    assert abs(share_of_token_1 - expected) < 0.03


def test_greedy_log_probs_of_engine_and_trainer_agree_at_temperature_one():
    # temperature 0 samples the argmax; both sides take its log-prob at temperature 1 (log_prob_temperature), so
    # they agree with each other and are finite. Logits 2, 0, -1 at the response position: the argmax is token 0,
    # log p = 2 - log(e^2 + 1 + e^-1) = 2 - log(8.7569) = -0.16984.
    step_logits = torch.tensor([[2.0, 0.0, -1.0]])
    greedy = sampling_options(n=1, response_length=1, temperature=0.0)
    token = sample_next_token(step_logits, greedy)
    engine = sampled_token_log_probs(step_logits, token, greedy)
    # the trainer sees the whole sequence: position 0 (the prompt's last token) predicts the response token
    sequence_logits = torch.stack([step_logits[0], torch.zeros(3)])[None]
    trainer, _ = compute_response_log_probs(sequence_logits, torch.tensor([[1, token.item()]]), 1, temperature=0.0)
    expected = 2.0 - math.log(math.exp(2.0) + 1.0 + math.exp(-1.0))
    assert token.tolist() == [0]
    assert abs(engine.item() - expected) < 1e-6 and abs(trainer.item() - expected) < 1e-6


def test_draws_follow_the_weights_with_one_random_number_per_row(monkeypatch):
    # weights e^0, e^2, e^1, e^-5, 0, e^0.5, e^3 (normalised by their sum, 35.25); 200k rows: the standard error of
    # a share is at most sqrt(0.25 / 200000) = 0.0011, so 0.006 is over five of them. Blocks of 1024 (one block),
    # 3 (two full blocks and a short tail) and 2 take the block path's every branch.
    logits = torch.tensor([0.0, 2.0, 1.0, -5.0, NEG_INF, 0.5, 3.0])
    expected = torch.softmax(logits, -1)
    for block in (1024, 3, 2):
        monkeypatch.setattr(sampling, "DRAW_BLOCK", block)
        draws = draw_categorical(expected.repeat(200_000, 1), torch.Generator().manual_seed(1))
        shares = torch.bincount(draws, minlength=7).float() / len(draws)
        assert (shares - expected).abs().max() < 0.006, (block, shares)
        assert shares[4] == 0  # a zero weight is never drawn


@pytest.mark.parametrize("block", [1024, 2])
def test_a_draw_never_lands_on_a_zero_weight_past_the_end_of_a_block(monkeypatch, block):
    # weights 0, 3, 0, 0, 0 and a uniform number of exactly 1 (the target at the running sum's end, as rounding can
    # put it): the search runs past the end, in blocks of 2 first past the blocks [0, 3], [0, 0], [0]; the draw must
    # stay on token 1, the last positive weight, never on the zeros after it
    monkeypatch.setattr(sampling, "DRAW_BLOCK", block)
    monkeypatch.setattr(torch, "rand", lambda *shape, generator=None, device=None: torch.ones(*shape, device=device))
    weights = torch.tensor([[0.0, 3.0, 0.0, 0.0, 0.0]])
    assert draw_categorical(weights).tolist() == [1]


def test_sampling_with_log_probs_matches_log_softmax_and_the_generator():
    # the one-softmax path: the log-prob of each drawn token is log_softmax(logits / T) at it
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 5000, generator=gen) * 3
    params = sampling_options(n=1, response_length=1, temperature=0.7, top_k=-1, top_p=1.0)
    tokens, log_probs = sample_with_log_probs(logits, params, torch.Generator().manual_seed(5))
    expected = torch.log_softmax(logits / 0.7, -1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(log_probs, expected, atol=1e-5)
    again, _ = sample_with_log_probs(logits, params, torch.Generator().manual_seed(5))
    assert torch.equal(tokens, again)  # a seeded rollout is reproducible
    # filtered and greedy calls take sample_next_token and sampled_token_log_probs, which agree with the same seed
    for options in (dict(top_k=3), dict(top_p=0.5), dict(do_sample=False)):
        filtered = sampling_options(n=1, response_length=1, temperature=0.7, **options)
        tokens, log_probs = sample_with_log_probs(logits, filtered, torch.Generator().manual_seed(2))
        reference = sample_next_token(logits, filtered, torch.Generator().manual_seed(2))
        assert torch.equal(tokens, reference)
        assert torch.equal(log_probs, sampled_token_log_probs(logits, reference, filtered))


def test_log_probs_stay_finite_and_exact_at_extreme_logits():
    # logits 0, 100, -100: token 2's probability e^-200 / (1 + e^-100 + e^-200) underflows float32 to 0, so it is
    # never drawn, and the drawn tokens' log-probs are log_softmax's: token 1 at -log(1 + e^-100 + e^-200) = 0
    logits = torch.tensor([[0.0, 100.0, -100.0]]).repeat(1000, 1)
    params = sampling_options(n=1, response_length=1, temperature=1.0, top_k=-1, top_p=1.0)
    tokens, log_probs = sample_with_log_probs(logits, params, torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {1}
    assert torch.isfinite(log_probs).all() and log_probs.abs().max() < 1e-6
