"""Tests for verl.utils.torch_functional: masked statistics, log-probs, entropy, response slicing, LR schedules."""

import math

import pytest
import torch

from verl.utils import torch_functional as tf


@pytest.fixture
def values_and_mask():
    # masked values are 1, 2, 4
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    return values, mask


# ---------------------------------------------------------------------------------------------- masked stats


def test_masked_sum_and_mean(values_and_mask):
    values, mask = values_and_mask
    # 1 + 2 + 4 = 7 over 3 valid entries
    assert tf.masked_sum(values, mask).item() == pytest.approx(7.0)
    assert tf.masked_mean(values, mask).item() == pytest.approx(7.0 / 3.0)
    # per row: sums [3, 4], means [1.5, 4]
    torch.testing.assert_close(tf.masked_sum(values, mask, axis=1), torch.tensor([3.0, 4.0]))
    torch.testing.assert_close(tf.masked_mean(values, mask, axis=1), torch.tensor([1.5, 4.0]))


def test_masked_mean_empty_mask_is_zero():
    values = torch.tensor([[1.0, 2.0]])
    out = tf.masked_mean(values, torch.zeros_like(values))
    assert torch.isfinite(out) and out.item() == 0.0
    # an empty row along an axis is 0 too, the other row is unaffected
    rows = tf.masked_mean(torch.ones(2, 2), torch.tensor([[0.0, 0.0], [1.0, 1.0]]), axis=1)
    torch.testing.assert_close(rows, torch.tensor([0.0, 1.0]))


def test_masked_var(values_and_mask):
    values, mask = values_and_mask
    # deviations from 7/3: -4/3, -1/3, 5/3 -> squares sum to 42/9 = 14/3; biased /3 = 14/9, unbiased /2 = 7/3
    assert tf.masked_var(values, mask, unbiased=False).item() == pytest.approx(14.0 / 9.0, rel=1e-6)
    assert tf.masked_var(values, mask).item() == pytest.approx(7.0 / 3.0, rel=1e-6)


@pytest.mark.parametrize("num_valid", [0, 1])
def test_masked_var_needs_two_values(num_valid):
    values = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.zeros(3)
    mask[:num_valid] = 1.0
    with pytest.raises(ValueError, match="at least 2"):
        tf.masked_var(values, mask)


def test_masked_whiten(values_and_mask):
    values, mask = values_and_mask
    whitened = tf.masked_whiten(values, mask)
    # (v - 7/3) / sqrt(7/3) on the valid entries: masked mean 0, unbiased masked var 1
    expected_first = (1.0 - 7.0 / 3.0) / math.sqrt(7.0 / 3.0)
    assert whitened[0, 0].item() == pytest.approx(expected_first, rel=1e-5)
    assert tf.masked_mean(whitened, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert tf.masked_var(whitened, mask).item() == pytest.approx(1.0, rel=1e-5)
    # shift_mean=False keeps the original mean: masked mean 7/3
    kept = tf.masked_whiten(values, mask, shift_mean=False)
    assert tf.masked_mean(kept, mask).item() == pytest.approx(7.0 / 3.0, rel=1e-5)
    torch.testing.assert_close(kept - whitened, torch.full_like(values, 7.0 / 3.0))


# ---------------------------------------------------------------------------------------------- log-probs


def _reference_logprobs(logits, labels):
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def test_logprobs_from_logits_fp32_matches_log_softmax(monkeypatch):
    # small chunk size so that the chunked logsumexp actually splits the 4 * 5 = 20 rows
    monkeypatch.setattr(tf, "_LOGSUMEXP_CHUNK_ROWS", 3)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5, 7, generator=gen) * 3
    labels = torch.randint(0, 7, (4, 5), generator=gen)
    out = tf.logprobs_from_logits(logits, labels)
    assert out.shape == (4, 5) and out.dtype == torch.float32
    torch.testing.assert_close(out, _reference_logprobs(logits, labels), atol=1e-6, rtol=0)


def test_logprobs_from_logits_fp16_is_close_and_fp32():
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(3, 4, 11, generator=gen) * 2).half()
    labels = torch.randint(0, 11, (3, 4), generator=gen)
    out = tf.logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _reference_logprobs(logits, labels), atol=1e-3, rtol=1e-3)


def test_logprobs_from_logits_gradient():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, generator=gen, requires_grad=True)
    labels = torch.tensor([1, 4])
    tf.logprobs_from_logits(logits, labels).sum().backward()
    # d log p(y) / d z = onehot(y) - softmax(z)
    expected = torch.nn.functional.one_hot(labels, 5).float() - torch.softmax(logits.detach(), dim=-1)
    torch.testing.assert_close(logits.grad, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_response_log_probs_and_their_lean_backward_match_autograd(dtype, temperature):
    # logits (B=5, S=9, V=13), response columns 3..6 (R=4); the reference is autograd through slice, divide and
    # logprobs_from_logits. d/dz of log p(label) is (onehot - softmax) / T on the response columns and 0 elsewhere.
    gen = torch.Generator().manual_seed(4)
    logits = (torch.randn(5, 9, 13, generator=gen) * 3).to(dtype).requires_grad_()
    labels = torch.randint(0, 13, (5, 4), generator=gen)
    weights = torch.randn(5, 4, generator=gen)
    ours = tf.response_log_probs(logits, labels, start=3, temperature=temperature)
    (ours * weights).sum().backward()
    ours_grad, logits.grad = logits.grad, None
    reference = tf.logprobs_from_logits(logits[:, 3:7].float() / temperature, labels)
    (reference * weights).sum().backward()
    assert ours.dtype == torch.float32 and ours_grad.dtype == dtype
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        ours_grad.float(), logits.grad.float(), atol=1e-3 if dtype == torch.float16 else 1e-6, rtol=0
    )
    assert (ours_grad[:, :3] == 0).all() and (ours_grad[:, 7:] == 0).all()


def test_response_log_probs_chunk_the_backward_over_rows(monkeypatch):
    # a chunk of one batch row at a time gives the gradient of one chunk for all rows
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 6, 11, generator=gen, requires_grad=True)
    labels = torch.randint(0, 11, (3, 2), generator=gen)
    tf.response_log_probs(logits, labels, 3).sum().backward()
    whole, logits.grad = logits.grad, None
    monkeypatch.setattr(tf, "_CHUNK_ELEMENTS", 1)
    tf.response_log_probs(logits, labels, 3).sum().backward()
    torch.testing.assert_close(logits.grad, whole, atol=1e-7, rtol=0)
    with pytest.raises(ValueError, match="outside logits"):
        tf.response_log_probs(logits, labels, 5)


def test_compute_response_log_probs_takes_only_the_last_positions_logits():
    # a model called with logits_to_keep=R+1 returns the last R+1 positions only: the same log-probs and entropy
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(2, 7, 10, generator=gen)
    input_ids = torch.randint(0, 10, (2, 7), generator=gen)
    full = tf.compute_response_log_probs(logits, input_ids, 3, 0.8, calculate_entropy=True)
    last = tf.compute_response_log_probs(logits[:, -4:], input_ids, 3, 0.8, calculate_entropy=True)
    for a, b in zip(full, last, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_entropy_uniform_and_peaked():
    vocab = 8
    uniform = tf.entropy_from_logits(torch.zeros(2, 3, vocab))
    assert uniform.shape == (2, 3)
    torch.testing.assert_close(uniform, torch.full((2, 3), math.log(vocab)))
    # one logit 100 above the rest: the others get ~e^-100 mass, entropy ~ 0
    peaked = torch.zeros(1, vocab)
    peaked[0, 3] = 100.0
    assert tf.entropy_from_logits(peaked).abs().item() < 1e-5
    # fp16 input comes back fp32
    assert tf.entropy_from_logits(torch.zeros(1, vocab, dtype=torch.float16)).dtype == torch.float32


def test_compute_response_log_probs_picks_shifted_positions_and_temperature():
    prompt_len, response_len, vocab = 3, 2, 4
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(1, prompt_len + response_len, vocab, generator=gen)
    # response token 0 is predicted at position P - 1 = 2, token 1 at position 3
    logits[0, 2] = 0.0  # uniform -> log(1/4) whatever the temperature
    logits[0, 3] = torch.tensor([2.0, 0.0, 0.0, 0.0])
    logits[0, 4] = 1e4  # the last position predicts nothing in the response and must be ignored
    input_ids = torch.tensor([[1, 2, 3, 2, 0]])
    log_probs, entropy = tf.compute_response_log_probs(
        logits, input_ids, response_len, temperature=2.0, calculate_entropy=True
    )
    assert log_probs.shape == (1, 2) and entropy.shape == (1, 2)
    # token 0 (id 2) from uniform logits: -log 4; token 1 (id 0) from [2, 0, 0, 0] / 2 = [1, 0, 0, 0]: 1 - log(e + 3)
    expected = torch.tensor([[-math.log(4.0), 1.0 - math.log(math.e + 3.0)]])
    torch.testing.assert_close(log_probs, expected, atol=1e-6, rtol=0)
    assert entropy[0, 0].item() == pytest.approx(math.log(4.0), rel=1e-6)
    # no entropy unless asked; temperature 1 leaves [2, 0, 0, 0] as is: 2 - log(e^2 + 3)
    log_probs_t1, none = tf.compute_response_log_probs(logits, input_ids, response_len)
    assert none is None
    assert log_probs_t1[0, 1].item() == pytest.approx(2.0 - math.log(math.e**2 + 3.0), rel=1e-6)


def test_compiled_entropy_gives_the_eager_numbers_from_one_graph(monkeypatch):
    # the "eager" backend: Dynamo's tracing, guards and recompilation without inductor's code generation (minutes on
    # this CPU); what inductor does with the graph is the same operations, fused
    import torch._dynamo.testing

    counter = torch._dynamo.testing.CompileCounterWithBackend("eager")
    monkeypatch.setattr(tf, "ENTROPY_COMPILE_BACKEND", counter)
    torch._dynamo.reset()
    input_ids = torch.tensor([[1, 2, 3, 2, 0]])
    for num_rows, chunking, checkpointing in ((2, False, False), (3, False, True), (4, True, False)):
        logits = torch.randn(num_rows, 5, 4, generator=torch.Generator().manual_seed(num_rows), requires_grad=True)
        logits.data[0, 2] = 0.0  # uniform: entropy log 4 for the first response token of row 0
        ids = input_ids.expand(num_rows, 5)
        options = {"calculate_entropy": True, "entropy_chunking": chunking, "entropy_checkpointing": checkpointing}
        _, want = tf.compute_response_log_probs(logits, ids, 2, **options)
        _, got = tf.compute_response_log_probs(logits, ids, 2, entropy_compiled=True, **options)
        assert got[0, 0].item() == pytest.approx(math.log(4.0), rel=1e-6)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        (want_grad,) = torch.autograd.grad(want.sum(), logits)
        (got_grad,) = torch.autograd.grad(got.sum(), logits)
        torch.testing.assert_close(got_grad, want_grad, atol=1e-6, rtol=0)
    # one graph per entropy function (plain, chunked), whatever the number of rows (dynamic shapes)
    assert counter.frame_count == 2
    assert tf.compiled_entropy(tf.entropy_from_logits) is tf.compiled_entropy(tf.entropy_from_logits)


# ---------------------------------------------------------------------------------------------- LR schedules


def _lrs(scheduler, optimizer, num_steps):
    lrs = []
    for _ in range(num_steps):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return lrs


def _optimizer():
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)


def test_constant_schedule_with_warmup():
    opt = _optimizer()
    sched = tf.build_lr_scheduler(opt, "constant", num_warmup_steps=4, num_training_steps=10)
    # (step + 1) / 4 during warm-up, then 1
    assert _lrs(sched, opt, 5) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])
    opt = _optimizer()
    assert _lrs(tf.build_lr_scheduler(opt, "constant", 0, 10), opt, 2) == pytest.approx([1.0, 1.0])


def test_cosine_schedule_with_warmup():
    opt = _optimizer()
    sched = tf.build_lr_scheduler(opt, "cosine", num_warmup_steps=2, num_training_steps=10, min_lr_ratio=0.1)
    lrs = _lrs(sched, opt, 13)
    # warm-up: 1/2, 2/2; then 0.1 + 0.9 * 0.5 * (1 + cos(pi * (step - 2) / 8))
    assert lrs[0] == pytest.approx(0.5)
    assert lrs[1] == pytest.approx(1.0)
    assert lrs[2] == pytest.approx(1.0)
    assert lrs[4] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))  # 0.868198
    assert lrs[6] == pytest.approx(0.55)
    assert lrs[10] == pytest.approx(0.1)
    assert lrs[12] == pytest.approx(0.1)  # past the end it stays at the floor


def test_cosine_schedule_num_cycles_sets_the_waves():
    opt = _optimizer()
    sched = tf.build_lr_scheduler(opt, "cosine", num_warmup_steps=0, num_training_steps=8, num_cycles=1.0)
    # one whole wave over 8 steps: 0.5 * (1 + cos(2 pi * step / 8)); past the end it stays where the wave ended
    assert _lrs(sched, opt, 11)[::2] == pytest.approx([1.0, 0.5, 0.0, 0.5, 1.0, 1.0])
    # verl's signature: num_cycles after min_lr_ratio; the default 0.5 is the half wave down to the floor
    opt = _optimizer()
    half = tf.get_cosine_schedule_with_warmup(opt, 0, 4, 0.2)
    assert _lrs(half, opt, 5) == pytest.approx(
        [1.0, 0.2 + 0.4 * (1 + math.cos(math.pi / 4)), 0.6, 0.2 + 0.4 * (1 + math.cos(3 * math.pi / 4)), 0.2]
    )


def test_lr_scheduler_errors():
    with pytest.raises(ValueError, match="constant"):
        tf.build_lr_scheduler(_optimizer(), "linear", 0, 10)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        tf.build_lr_scheduler(_optimizer(), "cosine", 0, 10, min_lr_ratio=1.5)
    with pytest.raises(ValueError, match="num_cycles"):
        tf.build_lr_scheduler(_optimizer(), "cosine", 0, 10, num_cycles=0.0)


def test_log_prob_temperature_is_one_for_greedy_and_the_temperature_otherwise():
    log_prob_temperature = tf.log_prob_temperature

    assert log_prob_temperature(0) == 1.0 and log_prob_temperature(0.0) == 1.0
    assert log_prob_temperature(0.7) == 0.7 and log_prob_temperature(1) == 1.0
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            log_prob_temperature(bad)


def test_response_log_probs_at_temperature_zero_are_the_untempered_ones():
    # greedy decoding (temperature 0) must not divide the logits by 0: its log-probs are those at temperature 1
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))
    input_ids = torch.randint(0, 7, (2, 5), generator=torch.Generator().manual_seed(1))
    greedy, greedy_entropy = tf.compute_response_log_probs(
        logits, input_ids, 3, temperature=0.0, calculate_entropy=True
    )
    plain, plain_entropy = tf.compute_response_log_probs(logits, input_ids, 3, temperature=1.0, calculate_entropy=True)
    assert torch.isfinite(greedy).all()
    assert torch.equal(greedy, plain) and torch.equal(greedy_entropy, plain_entropy)
