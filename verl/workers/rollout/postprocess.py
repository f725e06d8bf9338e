"""Turning raw generated tokens into the shared rollout layout: one mechanism for every rollout.

Whatever produced the tokens (the naive sampler or ``transformers`` ``generate``), a rollout hands its prompts
and raw response tokens to :func:`build_rollout_output`. It pads or cuts the responses to exactly the configured
length, keeps everything up to and including each row's first eos, replaces what follows with the pad token and
masks it out, and derives ``attention_mask``, ``position_ids`` and ``response_mask`` from the same rule the
actors use (``position_ids = clamp(cumsum(attention_mask) - 1, min=0)``). The prompt-side helpers here (eos
handling, left-padding check, position ids) are also what the naive sampler uses while it generates, so the two
paths cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verl.protocol import DataProto

__all__ = [
    "as_eos_ids",
    "build_rollout_output",
    "check_prompts",
    "compute_position_ids",
    "is_eos",
    "mask_after_eos",
]

PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")


def as_eos_ids(eos_token_id: int | Sequence[int]) -> list[int]:
    """Normalize an eos id (HF configs may hold one id or a list of them) to a non-empty list.

    Raises:
        ValueError: when no integer eos id is given.
    """
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(
            f"eos_token_id must be an int or a non-empty list of ints, got {eos_token_id!r}; pass the tokenizer's "
            "eos_token_id."
        )
    return ids


def is_eos(tokens: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """Boolean tensor of ``tokens``' shape, True where a token is one of ``eos_ids``."""
    return torch.isin(tokens, torch.tensor(list(eos_ids), dtype=tokens.dtype, device=tokens.device))


def compute_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions of the shared layout: ``clamp(cumsum(attention_mask) - 1, min=0)``.

    Args:
        attention_mask: (B, S) 0/1 mask, left-padded prompts followed by responses.

    Returns:
        (B, S) int64 positions; left padding gets 0, the first real token 0, the next 1, ...
    """
    return torch.clamp(attention_mask.long().cumsum(dim=-1) - 1, min=0)


def mask_after_eos(responses: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """Response mask: 1 up to and including each row's first eos, 0 after it; all 1 for rows without eos.

    Args:
        responses: (B, R) token ids.
        eos_ids: the eos token ids.

    Returns:
        (B, R) int64 mask.
    """
    eos = is_eos(responses, eos_ids).long()
    # number of eos strictly before position t: 0 means position t is at or before the first eos
    eos_before = torch.cumsum(eos, dim=-1) - eos
    return (eos_before == 0).long()


def check_prompts(prompts: DataProto) -> None:
    """Check that a prompt batch has the prompt keys and is left-padded.

    Raises:
        ValueError: a key is missing, shapes differ, or a row's last prompt token is padding.
    """
    keys = list(prompts.batch.keys()) if prompts.batch is not None else []
    missing = [key for key in PROMPT_KEYS if key not in keys]
    if missing:
        raise ValueError(f"Rollout prompts lack tensor key(s) {missing}; they need {list(PROMPT_KEYS)}, each (B, P).")
    shapes = {key: tuple(prompts.batch[key].shape) for key in PROMPT_KEYS}
    if len(set(shapes.values())) != 1 or len(shapes["input_ids"]) != 2:
        raise ValueError(f"Rollout prompt tensors must all be (B, P), got shapes {shapes}.")
    if not bool(prompts.batch["attention_mask"][:, -1].bool().all()):
        raise ValueError(
            "Rollout prompts must be LEFT-padded (every row's last token real, attention_mask[:, -1] == 1); "
            "pad prompts on the left, e.g. tokenizer.padding_side = 'left'."
        )


def build_rollout_output(
    prompts: DataProto,
    raw_responses: torch.Tensor,
    response_length: int,
    pad_token_id: int,
    eos_token_id: int | Sequence[int],
    raw_log_probs: torch.Tensor | None = None,
    ignore_eos: bool = False,
) -> DataProto:
    """Assemble the shared rollout layout from repeated prompts and raw generated tokens.

    Args:
        prompts: the already repeated prompt batch (B rows): ``input_ids``, ``attention_mask`` (B, P), left-padded,
            plus non-tensor fields and meta_info, which are carried over unchanged.
        raw_responses: (B, L) generated tokens, any L; tokens after a row's first eos may be anything.
        response_length: R; responses are cut or right-padded with ``pad_token_id`` to exactly R.
        pad_token_id: the padding id.
        eos_token_id: one eos id or a list of them.
        raw_log_probs: (B, L) the engine's log-probs of the generated tokens, or None.
        ignore_eos: an eos token does not end a response (``rollout.ignore_eos``): every generated token counts.

    Returns:
        DataProto with ``prompts`` (B, P), ``responses`` (B, R), ``input_ids``, ``attention_mask``,
        ``position_ids`` (B, P+R), ``response_mask`` (B, R), all int64; and ``rollout_log_probs`` (B, R) float32,
        0 where the response mask is 0, when ``raw_log_probs`` is given.
    """
    prompt_ids = prompts.batch["input_ids"]
    prompt_mask = prompts.batch["attention_mask"].long()
    num_rows, num_generated = raw_responses.shape
    assert num_rows == prompt_ids.shape[0], "one response row per repeated prompt"
    responses = raw_responses[:, :response_length].to(device=prompt_ids.device, dtype=torch.long)
    if num_generated < response_length:
        padding = responses.new_full((num_rows, response_length - num_generated), pad_token_id)
        responses = torch.cat([responses, padding], dim=-1)
    eos_ids = [] if ignore_eos else as_eos_ids(eos_token_id)
    # generation stops short of R only once every row has ended, so appended padding always lies after an eos
    # and is masked out explicitly (the pad id need not be an eos id)
    response_mask = mask_after_eos(responses, eos_ids)
    if num_generated < response_length:
        response_mask[:, num_generated:] = 0
    responses = responses.masked_fill(response_mask == 0, pad_token_id)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=-1)
    tensors = {
        "prompts": prompt_ids.long(),
        "responses": responses,
        "input_ids": torch.cat([prompt_ids.long(), responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": compute_position_ids(attention_mask),
        "response_mask": response_mask,
    }
    if raw_log_probs is not None:
        log_probs = raw_log_probs[:, :response_length].float().to(prompt_ids.device)
        if log_probs.shape[1] < response_length:
            log_probs = torch.cat([log_probs, log_probs.new_zeros(num_rows, response_length - log_probs.shape[1])], -1)
        tensors["rollout_log_probs"] = log_probs * response_mask
    return DataProto.from_dict(tensors, dict(prompts.non_tensor_batch), dict(prompts.meta_info))
