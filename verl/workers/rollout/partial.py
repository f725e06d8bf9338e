"""Partial rollouts: responses cut when new weights arrive, and continued with them.

With ``async_training.partial_rollout`` the trainer's weights reach a rollout worker while it generates (on a thread
of their own, :meth:`~verl.workers.rollout_worker.RolloutWorker.stage_weights`), and wait there as the *staged*
version in a :class:`WeightSwitch`. A rollout that can stop between two tokens (``naive``) asks the switch after every
token (``vllm``, which cannot be stopped from outside, samples at most a few dozen tokens per engine call instead:
:mod:`~verl.workers.rollout.vllm_rollout`); once weights are staged it stops, the switch puts them into the model, and
:func:`continue_paused` carries on with the responses that had not ended: each row's prompt and tokens so far become
the prompt of the continuation (their keys and values computed again by the new weights), which samples the rest of
the response. Every response token carries the version of the weights that sampled it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from verl.workers.rollout.postprocess import is_eos

# each response token's weight version (B, R) int64, in the output of a rollout with a weight switch
WEIGHT_VERSION_KEY = "weight_version"


class WeightSwitch:
    """The weights a rollout samples with: the version in the model, and a newer one staged to replace it.

    Args:
        apply: puts a staged set of weights into the model (called on the generating thread, between tokens or
            between calls, never while a forward pass runs).
        version: the version of the weights the model holds now.
    """

    def __init__(self, apply: Callable[[Any], None], version: int = 0):
        self._apply = apply
        self._lock = threading.Lock()
        self._staged: tuple[Any, int] | None = None
        self.version = version

    def stage(self, weights: Any, version: int) -> None:
        """Keep ``weights`` as ``version``, for the generating thread to apply (any thread; a newer stage replaces
        an older one that was never applied)."""
        with self._lock:
            self._staged = (weights, int(version))

    def requested(self) -> bool:
        """Whether newer weights wait: a rollout that can stop between two tokens stops."""
        return self._staged is not None

    def apply_staged(self) -> int:
        """Put the staged weights (if any) into the model; returns the version the model now holds."""
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is not None:
            weights, version = staged
            self._apply(weights)
            self.version = version
        return self.version


def continue_paused(
    generate: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    tokens: torch.Tensor,
    log_probs: torch.Tensor,
    response_length: int,
    stop_ids: list[int],
    switch: WeightSwitch,
    first_version: int,
    pad_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Finish the responses a weight switch cut, with the new weights, as often as switches come.

    Args:
        generate: ``(prompt ids, prompt mask, max new tokens) -> (tokens, log_probs)``, the rollout's own token
            generation for already repeated, left-padded prompts (one response each).
        input_ids, attention_mask: (B, P) the repeated prompts the responses answer.
        tokens, log_probs: (B, L) what the first call generated; L < ``response_length`` while rows are unfinished
            only when it stopped for a switch.
        response_length: R, the most tokens a response has.
        stop_ids: the ids that end a response (none with ``ignore_eos``).
        switch: the rollout's :class:`WeightSwitch`.
        first_version: the version the first call sampled with.
        pad_token_id: what fills the columns of rows that had ended.

    Returns:
        (tokens, log_probs, versions), each (B, L') with L' <= R: versions (int64) is the weight version of each
        token (that of the last switch past a row's end).
    """
    versions = torch.full(tokens.shape, first_version, dtype=torch.long, device=tokens.device)
    while tokens.shape[1] < response_length:
        done = tokens.shape[1]
        ended = is_eos(tokens, stop_ids).any(dim=-1) if stop_ids else torch.zeros_like(tokens[:, 0], dtype=torch.bool)
        rows = (~ended).nonzero(as_tuple=True)[0]
        if rows.numel() == 0:
            break
        version = switch.apply_staged()
        prompt_ids = torch.cat([input_ids[rows], tokens[rows]], dim=-1)
        prompt_mask = torch.cat([attention_mask[rows], attention_mask.new_ones(rows.numel(), done)], dim=-1)
        more_tokens, more_log_probs = generate(prompt_ids, prompt_mask, response_length - done)
        width = more_tokens.shape[1]
        tokens = torch.cat([tokens, tokens.new_full((tokens.shape[0], width), pad_token_id)], dim=-1)
        log_probs = torch.cat([log_probs, log_probs.new_zeros(log_probs.shape[0], width)], dim=-1)
        versions = torch.cat([versions, versions.new_full((versions.shape[0], width), version)], dim=-1)
        tokens[rows, done:] = more_tokens
        log_probs[rows, done:] = more_log_probs.to(log_probs.dtype)
    return tokens, log_probs, versions
