"""The chunked log-prob/entropy kernel (``model.use_fused_kernels``) and the chunked entropy computes what the full
logits path computes, values and gradients, in float32.

Tolerances: the two paths run the same float32 operations on every logit; what may differ is the order of additions
inside a product (the matrix product over the hidden size H for a chunk of rows vs. for all rows, the transposed
products over V and over the tokens in the backward pass) and the weight gradient's sum over chunks. By
``tests/tolerances.py``, two orders of a sum of n terms are within ``n * eps * max|value|``; a log-prob or an entropy
goes through the logit product (H terms) and a sum over the vocabulary (V terms), a gradient through those and the
backward products (V terms for the hidden states, N tokens for the weight), so ``H + V`` and ``2 (H + V) + N`` terms
bound them. On these sizes that is about 1e-4 relative; a wrong sign, a missed temperature or a dropped entropy term
changes values at order 1.
"""

import pytest
import torch

from tests.tolerances import reordering_tolerance
from verl.utils.kernel import chunk_rows_for_vocab, linear_log_probs_and_entropy, response_log_probs_from_hidden
from verl.utils.torch_functional import (
    compute_response_log_probs,
    entropy_from_logits,
    entropy_from_logits_with_chunking,
    logprobs_from_logits,
)

N, H, V = 45, 24, 101  # 45 tokens in chunks of 8: five full chunks and a ragged one


def inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen, requires_grad=True)
    weight = (torch.randn(V, H, generator=gen) / H**0.5).requires_grad_()
    labels = torch.randint(0, V, (N,), generator=gen)
    return hidden, weight, labels


def full_path(hidden, weight, labels, temperature):
    logits = hidden @ weight.T / temperature
    return logprobs_from_logits(logits, labels), entropy_from_logits(logits)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("chunk_rows", [8, N, 1000])
def test_chunked_log_probs_entropy_and_gradients_equal_the_full_path(temperature, chunk_rows):
    hidden, weight, labels = inputs()
    want_lp, want_ent = full_path(hidden, weight, labels, temperature)
    got_lp, got_ent = linear_log_probs_and_entropy(hidden, weight, labels, temperature, True, chunk_rows)
    torch.testing.assert_close(got_lp, want_lp, atol=reordering_tolerance(want_lp, H + V), rtol=0)
    torch.testing.assert_close(got_ent, want_ent, atol=reordering_tolerance(want_ent, H + V), rtol=0)
    # random weights on both outputs: every term of both backward formulas reaches the gradient
    gen = torch.Generator().manual_seed(1)
    w_lp, w_ent = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    want = torch.autograd.grad((want_lp * w_lp).sum() + (want_ent * w_ent).sum(), (hidden, weight))
    got = torch.autograd.grad((got_lp * w_lp).sum() + (got_ent * w_ent).sum(), (hidden, weight))
    for name, g, w in zip(("hidden", "weight"), got, want):
        torch.testing.assert_close(g, w, atol=reordering_tolerance(w, 2 * (H + V) + N), rtol=0, msg=name)


def test_without_entropy_only_the_log_prob_gradient_flows():
    hidden, weight, labels = inputs(2)
    got_lp, got_ent = linear_log_probs_and_entropy(hidden, weight, labels, 1.0, False, 8)
    assert got_ent is None
    want_lp, _ = full_path(hidden, weight, labels, 1.0)
    want = torch.autograd.grad(want_lp.sum(), (hidden, weight))
    got = torch.autograd.grad(got_lp.sum(), (hidden, weight))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=reordering_tolerance(w, 2 * (H + V) + N), rtol=0)


def test_the_entropy_gradient_is_its_own_term():
    # the kernel's entropy gradient alone (log-probs unweighted) against autograd of the full formula: a kernel that
    # dropped the -p (log p + H) term would pass the test above only through the log-prob term
    hidden, weight, labels = inputs(3)
    _, want_ent = full_path(hidden, weight, labels, 0.8)
    _, got_ent = linear_log_probs_and_entropy(hidden, weight, labels, 0.8, True, 8)
    want = torch.autograd.grad(want_ent.sum(), hidden)[0]
    got = torch.autograd.grad(got_ent.sum(), hidden)[0]
    assert want.abs().max() > 1e-2  # the entropy does depend on the hidden states
    torch.testing.assert_close(got, want, atol=reordering_tolerance(want, 2 * (H + V) + N), rtol=0)


def test_response_positions_and_greedy_temperature_match_compute_response_log_probs():
    # (B, S, H) hidden states; position t predicts token t + 1, the last R tokens are the response; temperature 0
    # (greedy sampling) takes the log-probs at 1, as the plain path does
    gen = torch.Generator().manual_seed(4)
    batch, seq, response = 3, 7, 4
    hidden = torch.randn(batch, seq, H, generator=gen)
    weight = torch.randn(V, H, generator=gen) / H**0.5
    input_ids = torch.randint(0, V, (batch, seq), generator=gen)
    for temperature in (0.0, 0.7):
        want = compute_response_log_probs(hidden @ weight.T, input_ids, response, temperature, True)
        got = response_log_probs_from_hidden(hidden, weight, input_ids, response, temperature, True, chunk_rows=5)
        for g, w in zip(got, want):
            assert g.shape == (batch, response)
            torch.testing.assert_close(g, w, atol=reordering_tolerance(w, H + V), rtol=0)


def test_chunk_rows_follow_the_vocabulary():
    # 2**25 fp32 logits per chunk: 1024 tokens of a 32768 vocabulary, 220 of Qwen2's 151936, never fewer than 1
    assert chunk_rows_for_vocab(32768) == 1024
    assert chunk_rows_for_vocab(151936) == 2**25 // 151936 == 220
    assert chunk_rows_for_vocab(2**30) == 1


def test_chunked_and_checkpointed_entropy_equal_the_plain_entropy():
    # the same per-row formula over row chunks: bitwise equal values; checkpointing recomputes the same numbers
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 9, V, generator=gen, requires_grad=True)
    want = entropy_from_logits(logits)
    got = entropy_from_logits_with_chunking(logits, chunk_rows=4)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    input_ids = torch.randint(0, V, (2, 9), generator=gen)
    plain = compute_response_log_probs(logits, input_ids, 5, 1.0, True)[1]
    for options in (
        {"entropy_chunking": True},
        {"entropy_checkpointing": True},
        {"entropy_chunking": True, "entropy_checkpointing": True},
    ):
        other = compute_response_log_probs(logits, input_ids, 5, 1.0, True, **options)[1]
        torch.testing.assert_close(other, plain, atol=0, rtol=0)
        g_want = torch.autograd.grad(plain.sum(), logits, retain_graph=True)[0]
        g_got = torch.autograd.grad(other.sum(), logits)[0]
        torch.testing.assert_close(g_got, g_want, atol=reordering_tolerance(g_want, V), rtol=0)
