"""Tensor helpers shared by the losses, the actors and the trainer: masked statistics, log-probs, schedules.

Log-probs are computed as ``logit[label] - logsumexp(logits)`` in fp32, one chunk of rows at a time, so that a
half-precision batch never needs a full-vocabulary fp32 ``log_softmax`` copy of itself.
"""

from __future__ import annotations

import math

import torch
import torch.utils.checkpoint
from torch.optim.lr_scheduler import LambdaLR

_LOGSUMEXP_CHUNK_ROWS = 1024
# torch.compile's backend of the compiled entropy (compute_response_log_probs' entropy_compiled); tests swap in a
# cheaper one. The compiled functions, one per (entropy function, backend), are built on first use.
ENTROPY_COMPILE_BACKEND = "inductor"
_COMPILED_ENTROPY: dict[tuple, object] = {}


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1 (over all elements, or along ``axis``)."""
    return (values * mask).sum() if axis is None else (values * mask).sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1 (an empty mask gives 0, not NaN)."""
    total = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / total.clamp(min=1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked values (Bessel-corrected when ``unbiased``)."""
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count <= 1:
            raise ValueError(f"masked_var needs at least 2 unmasked values for an unbiased estimate, got {count}.")
        variance = variance * count / (count - 1)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / std over the masked positions; the mean is added back when not ``shift_mean``."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def _chunked_logsumexp(logits: torch.Tensor) -> torch.Tensor:
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [chunk.float().logsumexp(dim=-1) for chunk in flat.split(_LOGSUMEXP_CHUNK_ROWS)]
    return torch.cat(parts).view(logits.shape[:-1])


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) under softmax(logits).

    Args:
        logits: (..., V), any float dtype.
        labels: (...) int64.

    Returns:
        (...) float32 log-probabilities.
    """
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
    return picked - _chunked_logsumexp(logits)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (...,) of softmax(logits (..., V)), in fp32: logsumexp(z) - sum(softmax(z) * z)."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def entropy_from_logits_with_chunking(logits: torch.Tensor, chunk_rows: int = 2048) -> torch.Tensor:
    """:func:`entropy_from_logits` over ``chunk_rows`` rows at a time (``actor.entropy_from_logits_with_chunking``).

    The fp32 copy, softmax and product exist for one chunk at a time instead of the whole (..., V) tensor, which
    lowers the peak of a pass without gradients; with gradients autograd still keeps each chunk's softmax, unless
    ``actor.entropy_checkpointing`` recomputes them in the backward pass.

    Args:
        logits: (..., V), any float dtype.
        chunk_rows: rows (positions) per chunk.

    Returns:
        (...) float32 entropy.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [entropy_from_logits(chunk) for chunk in flat.split(chunk_rows)]
    return torch.cat(parts).view(logits.shape[:-1])


def compiled_entropy(entropy_fn):
    """``entropy_fn`` (:func:`entropy_from_logits` or its chunked form) under ``torch.compile(dynamic=True)``: one
    graph for every batch and response length, built once per process and backend (:data:`ENTROPY_COMPILE_BACKEND`).
    Duck sizing is off, so that a batch as long as its responses (B == R) does not get a graph of its own."""
    key = (entropy_fn, ENTROPY_COMPILE_BACKEND)
    if key not in _COMPILED_ENTROPY:
        compiled = torch.compile(entropy_fn, dynamic=True, backend=ENTROPY_COMPILE_BACKEND)

        def entropy(logits: torch.Tensor) -> torch.Tensor:
            with torch.fx.experimental._config.patch(use_duck_shape=False):
                return compiled(logits)

        _COMPILED_ENTROPY[key] = entropy
    return _COMPILED_ENTROPY[key]


def log_prob_temperature(temperature: float) -> float:
    """The temperature at which the log-probs of tokens sampled at ``temperature`` are taken.

    The sampling temperature itself, except 0 (greedy decoding): greedy tokens have no tempered distribution (its
    limit is one-hot), so their log-probs are the model's own, at temperature 1, as in verl. The trainer
    (:func:`compute_response_log_probs`) and every rollout engine apply this one rule, so that their log-probs of the
    same tokens agree.

    Raises:
        ValueError: a negative or non-finite temperature.
    """
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"The sampling temperature must be a finite number >= 0 (0: greedy), got {temperature!r}.")
    return 1.0 if temperature == 0 else float(temperature)


# fp32 elements of one chunk of the response log-probs' forward and backward passes (64 MiB)
_CHUNK_ELEMENTS = 2**24


class _ResponseLogProbs(torch.autograd.Function):
    """``log_softmax(logits[:, start:start+R] / T)`` at ``labels``, with a backward pass that writes the gradient of
    the whole ``logits`` in one buffer.

    Autograd's own graph for the same arithmetic (slice, divide, logsumexp, gather, subtract) allocates and fills
    several full-vocabulary tensors in its backward pass: the logsumexp's softmax, its product with the incoming
    gradient, the gather's zero-filled scatter target, their sum, and a zero-filled tensor of the whole logits'
    shape for the slice. On a CPU those passes over memory, not the output projection's product, took most of an
    update with a large vocabulary (Qwen2's 151,936 tokens: 8 of the 14 s of the update of ``bench_vs_trl``'s
    ``qwen2-20m-v152k`` case). Here the gradient is ``(onehot(label) - softmax(z)) * g / T``, written chunk by chunk
    straight into one uninitialised buffer of the logits' shape (three passes: subtract, exponentiate, scale; then
    the label's entries), and only the columns outside the response are zeroed.
    """

    @staticmethod
    def forward(ctx, logits, labels, start, temperature):
        response = labels.shape[-1]
        z = logits[:, start : start + response]
        picked = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
        # a few batch rows at a time, on the strided slice itself: its fp32 (and tempered) copy is one chunk's
        rows = max(1, _CHUNK_ELEMENTS // max(1, response * logits.shape[-1]))
        log_z = torch.cat([_tempered(chunk, temperature).logsumexp(dim=-1) for chunk in z.split(rows)])
        ctx.save_for_backward(logits, labels, log_z)
        ctx.start, ctx.temperature, ctx.rows = start, temperature, rows
        return picked / temperature - log_z

    @staticmethod
    def backward(ctx, grad):
        logits, labels, log_z = ctx.saved_tensors
        start, temperature, rows = ctx.start, ctx.temperature, ctx.rows
        batch, response = labels.shape
        grad_logits = torch.empty_like(logits)
        grad_logits[:, :start].zero_()
        grad_logits[:, start + response :].zero_()
        scale = grad.float() / temperature  # (B, R): d loss / d z_j = scale * ([j = label] - p_j)
        for first in range(0, batch, rows):
            part = slice(first, first + rows)
            z = _tempered(logits[part, start : start + response], temperature)
            out = grad_logits[part, start : start + response]
            # the chunk's -p * scale, computed in fp32 (into the gradient itself when it is fp32)
            fp32_out = out if out.dtype == torch.float32 else None
            probs = (
                torch.sub(z, log_z[part, :, None], out=fp32_out) if fp32_out is not None else z - log_z[part, :, None]
            )
            probs.exp_().mul_(scale[part, :, None].neg())
            probs.scatter_add_(-1, labels[part, :, None], scale[part, :, None])
            if fp32_out is None:
                out.copy_(probs)
        return grad_logits, None, None, None


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` in float32 (``logits`` itself when it is float32 and the temperature 1)."""
    logits = logits.float()
    return logits if temperature == 1.0 else logits / temperature


def response_log_probs(
    logits: torch.Tensor, labels: torch.Tensor, start: int, temperature: float = 1.0
) -> torch.Tensor:
    """``log_softmax(logits[:, start:start + R] / temperature)`` at ``labels`` (B, R), in float32; differentiable
    with respect to ``logits`` (B, S, V) through a lean backward pass (see :class:`_ResponseLogProbs`)."""
    if not 0 <= start <= logits.shape[1] - labels.shape[-1]:
        raise ValueError(f"response columns [{start}, {start + labels.shape[-1]}) outside logits of {logits.shape[1]}")
    return _ResponseLogProbs.apply(logits, labels, start, float(temperature))


def compute_response_log_probs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    entropy_chunking: bool = False,
    entropy_checkpointing: bool = False,
    entropy_compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of the response tokens from full-sequence logits.

    Args:
        logits: (B, S, V) logits of the whole sequence, or (B, L, V) of its last L >= R + 1 positions only (a model
            called with ``logits_to_keep``); position t predicts token t + 1.
        input_ids: (B, S) tokens whose last ``response_length`` positions are the response.
        response_length: R.
        temperature: the rollout's sampling temperature; logits are divided by it (by 1 for greedy decoding, 0:
            see :func:`log_prob_temperature`).
        calculate_entropy: also return the entropy of each predictive distribution.
        entropy_chunking: the entropy a chunk of positions at a time (:func:`entropy_from_logits_with_chunking`).
        entropy_checkpointing: recompute the entropy's intermediates in the backward pass instead of keeping them.
        entropy_compiled: the entropy under ``torch.compile`` (:func:`compiled_entropy`): the same operations, fused.

    Returns:
        (log_probs (B, R) float32, entropy (B, R) float32 or None)
    """
    seq_len = input_ids.shape[-1]
    start = logits.shape[1] - response_length - 1  # the logits' column that predicts the first response token
    temperature = log_prob_temperature(temperature)
    labels = input_ids[:, seq_len - response_length :]
    log_probs = response_log_probs(logits, labels, start, temperature)
    entropy = None
    if calculate_entropy:
        response_logits = logits[:, start : start + response_length, :]
        if temperature != 1.0:
            response_logits = response_logits / temperature
        entropy_fn = entropy_from_logits_with_chunking if entropy_chunking else entropy_from_logits
        if entropy_compiled:
            entropy_fn = compiled_entropy(entropy_fn)
        if entropy_checkpointing and response_logits.requires_grad:
            entropy = torch.utils.checkpoint.checkpoint(entropy_fn, response_logits, use_reentrant=False)
        else:
            entropy = entropy_fn(response_logits)
    return log_probs, entropy


def get_constant_schedule_with_warmup(optimizer, num_warmup_steps: int) -> LambdaLR:
    """LR rises linearly from 0 over ``num_warmup_steps`` steps, then stays at the base LR."""

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / num_warmup_steps) if num_warmup_steps > 0 else 1.0

    return LambdaLR(optimizer, factor)


def get_cosine_schedule_with_warmup(
    optimizer, num_warmup_steps: int, num_training_steps: int, min_lr_ratio: float = 0.0, num_cycles: float = 0.5
) -> LambdaLR:
    """Linear warm-up, then ``num_cycles`` cosine waves between the base LR and ``min_lr_ratio`` x base LR over the
    remaining steps (verl's 0.5: a half wave, from the base LR down to the floor); the LR stays where the wave ends
    after ``num_training_steps``."""

    def factor(step: int) -> float:
        if num_warmup_steps > 0 and step < num_warmup_steps:
            return (step + 1) / num_warmup_steps
        span = max(1, num_training_steps - num_warmup_steps)
        progress = min(1.0, (step - num_warmup_steps) / span)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(2.0 * math.pi * num_cycles * progress))

    return LambdaLR(optimizer, factor)


LR_SCHEDULERS = ("constant", "cosine")


def build_lr_scheduler(
    optimizer,
    name: str,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
) -> LambdaLR:
    """The LR schedule ``name`` (constant | cosine), stepped once per training step."""
    if name == "constant":
        return get_constant_schedule_with_warmup(optimizer, num_warmup_steps)
    if name == "cosine":
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {min_lr_ratio}.")
        if not num_cycles > 0:
            raise ValueError(f"optim.num_cycles must be > 0, got {num_cycles}.")
        return get_cosine_schedule_with_warmup(
            optimizer, num_warmup_steps, num_training_steps, min_lr_ratio, num_cycles
        )
    raise ValueError(f"optim.lr_scheduler={name!r} is not supported; use one of {list(LR_SCHEDULERS)}.")
