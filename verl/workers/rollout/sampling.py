"""Next-token selection for the naive rollout: temperature, top-k and nucleus (top-p) filtering, then a draw.

The filters follow the order ``transformers`` applies its logits warpers in (temperature, then top-k, then
top-p), so the naive and the Hugging Face rollouts sample from the same distribution given the same logits. All
arithmetic is in float32 whatever the model's dtype, so that fp16 logits do not lose the small probabilities the
nucleus cut-off compares. Draws take an optional ``torch.Generator``, which is what makes a seeded rollout
reproducible; a draw costs one random number per row, not one per vocabulary entry (:func:`draw_categorical`).
"""

from __future__ import annotations

import torch

from verl.utils.torch_functional import log_prob_temperature
from verl.workers.rollout.base import SamplingParams

__all__ = ["apply_top_k", "apply_top_p", "draw_categorical", "sample_next_token", "sample_with_log_probs"]

# Rows of a draw's cumulative sum are cut into blocks of this many tokens (see draw_categorical).
DRAW_BLOCK = 1024


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Set every logit below the k-th largest of its row to ``-inf``.

    Args:
        logits: (B, V) float logits.
        top_k: number of tokens to keep; ``<= 0`` or ``>= V`` returns ``logits`` unchanged.

    Returns:
        (B, V) filtered logits (ties with the k-th value are kept).
    """
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth_value = torch.topk(logits, top_k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth_value, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches ``top_p``; always at least one.

    A token is kept when the probability mass of the tokens ranked above it is still below ``top_p``, so the
    most likely token always survives (``top_p = 0`` is greedy).

    Args:
        logits: (B, V) float logits.
        top_p: probability mass in [0, 1]; 1.0 returns ``logits`` unchanged.

    Returns:
        (B, V) filtered logits.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, sorted_index = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    remove_sorted = mass_before >= top_p
    remove_sorted[:, 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(-1, sorted_index, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def sampled_token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The engine's own log-probability of each chosen token, as the trainer computes it.

    ``log_softmax(logits / temperature)`` at the token, in float32, from the logits the engine sampled from (in
    the engine's precision): no top-k/top-p renormalisation, because the trainer's log-probs have none either, so
    the two differ only by how each computed its logits. Greedy calls (temperature 0) use temperature 1, the one rule of
    :func:`~verl.utils.torch_functional.log_prob_temperature`.

    Args:
        logits: (B, V) last-position logits, any float dtype.
        tokens: (B,) chosen token ids.
        params: the call's sampling options.

    Returns:
        (B,) float32 log-probabilities.
    """
    log_probs = torch.log_softmax(logits.float() / log_prob_temperature(params.temperature), dim=-1)
    return log_probs.gather(-1, tokens[:, None].long()).squeeze(-1)


def sample_next_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Pick one token per row from last-position logits.

    Args:
        logits: (B, V) logits of the last position, any float dtype.
        params: sampling options; greedy when ``params.greedy``.
        generator: random source for the draw; None uses torch's global random state.

    Returns:
        (B,) int64 token ids.
    """
    logits = logits.float()
    if params.greedy:
        return torch.argmax(logits, dim=-1)
    logits = logits / params.temperature
    logits = apply_top_k(logits, params.top_k)
    logits = apply_top_p(logits, params.top_p)
    return draw_categorical(torch.softmax(logits, dim=-1), generator)


def sample_with_log_probs(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_next_token` and :func:`sampled_token_log_probs` of the drawn tokens, in one pass where it can.

    Without top-k or top-p filtering (verl's rollout default) the draw and the log-probability share one softmax
    of z = logits / temperature: the token is drawn from it (:func:`draw_categorical`, one random number per row)
    and its log-probability is the log of its softmax entry, which is log_softmax(z)[token]. A drawn token's entry
    is never 0 (zero weights are never drawn), so its log is finite. Greedy decoding and filtered sampling take the
    two functions one after the other (their log-probs are of the unfiltered distribution, see
    :func:`sampled_token_log_probs`). Nothing here waits on the device.

    Args:
        logits: (B, V) last-position logits, any float dtype.
        params: the call's sampling options.
        generator: random source for the draw; None uses torch's global random state.

    Returns:
        (B,) int64 token ids, (B,) float32 log-probabilities.
    """
    vocab = logits.shape[-1]
    filtered = 0 < params.top_k < vocab or params.top_p < 1.0
    if params.greedy or filtered:
        tokens = sample_next_token(logits, params, generator)
        return tokens, sampled_token_log_probs(logits, tokens, params)
    scaled = logits.float()
    if params.temperature != 1.0:
        scaled = scaled / params.temperature
    probs = torch.softmax(scaled, dim=-1)
    tokens = draw_categorical(probs, generator)
    return tokens, probs.gather(-1, tokens[:, None]).squeeze(-1).log()


def draw_categorical(weights: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of ``weights`` (B, V), drawn with probability weights[i] / sum(weights) by inverse transform.

    ``torch.multinomial`` draws one random number per category (V per row): on a CPU that is most of a decode
    step's time once the vocabulary is large (273 ms for 64 rows of Qwen2's 151,936 tokens, against 13 ms for the LM
    head's product at hidden size 128). This draws one uniform number per row instead. The row's weights are summed
    in blocks of :data:`DRAW_BLOCK` tokens; the block is found on the running sum of the block sums, and the token
    on the running sum inside that one block, so every partial sum is over at most a few hundred terms (float32
    keeps its precision) and the only full pass over the vocabulary is the block sum. A zero weight is never drawn.

    Args:
        weights: (B, V) non-negative float weights, each row with a positive sum; need not be normalised.
        generator: random source; None uses torch's global random state.

    Returns:
        (B,) int64 indices.
    """
    weights = weights.float()
    rows, vocab = weights.shape
    block = min(DRAW_BLOCK, vocab)
    num_full = vocab // block
    block_sums = weights[:, : num_full * block].reshape(rows, num_full, block).sum(-1)
    if num_full * block < vocab:
        block_sums = torch.cat([block_sums, weights[:, num_full * block :].sum(-1, keepdim=True)], dim=-1)
    running = block_sums.cumsum(-1)
    target = torch.rand(rows, 1, generator=generator, device=weights.device) * running[:, -1:]
    # The block where the running sum first exceeds the target, then the token inside it. Rounding can put the target
    # at or past the end of a running sum; the draw then stays on the last block (and inside a block, the last
    # token) of positive weight, so that a zero weight (a filtered token) is never drawn.
    chosen_block = torch.minimum(torch.searchsorted(running, target, right=True), _last_positive(block_sums))
    before = (running.gather(-1, chosen_block) - block_sums.gather(-1, chosen_block)).squeeze(-1)
    offsets = torch.arange(block, device=weights.device)
    columns = (chosen_block * block + offsets).clamp_max(vocab - 1)  # the last block may be shorter
    inside = weights.gather(-1, columns) * (chosen_block * block + offsets < vocab)
    remaining = (target.squeeze(-1) - before).clamp_min(0)[:, None]
    position = torch.minimum(torch.searchsorted(inside.cumsum(-1), remaining, right=True), _last_positive(inside))
    return columns.gather(-1, position).squeeze(-1)


def _last_positive(values: torch.Tensor) -> torch.Tensor:
    """(B, 1): the index of each row's last positive entry of ``values`` (B, N)."""
    positions = torch.arange(values.shape[-1], device=values.device)
    return torch.where(values > 0, positions, 0).amax(-1, keepdim=True)
