"""Next-token selection for the naive rollout: temperature, top-k and nucleus (top-p) filtering, then a draw.

The filters follow the order ``transformers`` applies its logits warpers in (temperature, then top-k, then
top-p), so the naive and the Hugging Face rollouts sample from the same distribution given the same logits. All
arithmetic is in float32 whatever the model's dtype, so that fp16 logits do not lose the small probabilities the
nucleus cut-off compares. Draws take an optional ``torch.Generator``, which is what makes a seeded rollout
reproducible.
"""

from __future__ import annotations

import torch

from verl.utils.torch_functional import log_prob_temperature
from verl.workers.rollout.base import SamplingParams

__all__ = ["apply_top_k", "apply_top_p", "sample_next_token"]


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
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
