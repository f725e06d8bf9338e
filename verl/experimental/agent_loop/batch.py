"""The trainer's batch from agent-loop outputs, in the layout every rollout here produces.

Each :class:`~verl.experimental.agent_loop.agent_loop.AgentLoopOutput` is one trajectory: prompt ids, then the
response (the model's turns and the tool / user turns between them) with a mask that is 1 on the model's ids only.
:func:`assemble_batch` pads them into the tensors of
:func:`~verl.workers.rollout.postprocess.build_rollout_output`:

- ``prompts`` (B, P): left-padded with the pad id to ``rollout.prompt_length``;
- ``responses`` (B, R): right-padded to ``rollout.response_length`` (a longer trajectory is cut, mask and all);
- ``input_ids`` = prompts + responses; ``attention_mask`` 1 on every real id (tool ids included, as the model
  reads them), 0 on padding; ``position_ids = clamp(cumsum(attention_mask) - 1, min=0)``;
- ``response_mask`` (B, R): the loop's mask (0 on tool / user ids) and 0 on padding: only the model's ids enter
  the policy loss, the KL and the entropy;
- ``rollout_log_probs`` (B, R) float32, 0 wherever the mask is 0, when every trajectory has log-probs;
- ``rm_scores`` (B, R): a loop's own ``reward_score`` at the last real response position, when every trajectory
  has one (the reward function is then not called, as in verl).

Non-tensor fields, as verl's agent-loop worker writes them: ``__num_turns__`` (int32), one column per key of the
outputs' ``extra_fields`` (verl's ``turn_scores``, ``tool_rewards``, ``min_global_steps``, ``max_global_steps``,
``extras`` always present, None where a loop set none), and ``tool_extra_fields`` (each row's whole
``extra_fields`` dict), which the reward manager merges into the scorer's ``extra_info`` as verl's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.workers.rollout.postprocess import compute_position_ids

__all__ = ["DEFAULT_EXTRA_KEYS", "assemble_batch", "padded_tensors"]

# the extra-field columns verl's worker always writes, so that batches of different loops concatenate
DEFAULT_EXTRA_KEYS = ("turn_scores", "tool_rewards", "min_global_steps", "max_global_steps", "extras")


def _objects(values: Sequence[Any]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array


def padded_tensors(
    outputs: Sequence[AgentLoopOutput], prompt_length: int, response_length: int, pad_token_id: int
) -> dict[str, torch.Tensor]:
    """The tensors of the module's layout (all but ``rollout_log_probs`` and ``rm_scores``), int64."""
    rows = len(outputs)
    prompts = torch.full((rows, prompt_length), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((rows, prompt_length), dtype=torch.long)
    responses = torch.full((rows, response_length), pad_token_id, dtype=torch.long)
    response_attention = torch.zeros((rows, response_length), dtype=torch.long)
    response_mask = torch.zeros((rows, response_length), dtype=torch.long)
    for row, output in enumerate(outputs):
        prompt_ids = list(output.prompt_ids)[-prompt_length:]  # a loop cuts its prompt already; never wider
        if prompt_ids:
            prompts[row, prompt_length - len(prompt_ids) :] = torch.tensor(prompt_ids, dtype=torch.long)
            prompt_mask[row, prompt_length - len(prompt_ids) :] = 1
        ids = list(output.response_ids)[:response_length]
        if len(output.response_mask) != len(output.response_ids):
            raise ValueError(
                f"an agent loop returned {len(output.response_ids)} response ids but {len(output.response_mask)} "
                "mask values; they must be the same length"
            )
        if ids:
            responses[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            response_attention[row, : len(ids)] = 1
            response_mask[row, : len(ids)] = torch.tensor(list(output.response_mask)[: len(ids)], dtype=torch.long)
    attention_mask = torch.cat([prompt_mask, response_attention], dim=-1)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": compute_position_ids(attention_mask),
        "response_mask": response_mask,
    }


def _log_probs(outputs: Sequence[AgentLoopOutput], mask: torch.Tensor) -> torch.Tensor | None:
    """(B, R) float32 rollout log-probs, 0 where the mask is 0; None unless every output has them."""
    if any(output.response_logprobs is None for output in outputs):
        return None
    log_probs = torch.zeros(mask.shape, dtype=torch.float32)
    for row, output in enumerate(outputs):
        values = list(output.response_logprobs)[: mask.shape[1]]
        if values:
            log_probs[row, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return log_probs * mask


def _scores(outputs: Sequence[AgentLoopOutput], attention: torch.Tensor) -> torch.Tensor | None:
    """(B, R) ``rm_scores``: each loop's score at its last real response position; None unless all scored."""
    if any(output.reward_score is None for output in outputs):
        return None
    last = (attention.sum(-1) - 1).clamp(min=0)
    scores = torch.zeros(attention.shape, dtype=torch.float32)
    scores[torch.arange(len(outputs)), last] = torch.tensor([float(o.reward_score) for o in outputs])
    return scores


def assemble_batch(
    outputs: Sequence[AgentLoopOutput], prompt_length: int, response_length: int, pad_token_id: int
) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """The tensors and the non-tensor columns of the module's layout (the caller adds the input rows' fields)."""
    tensors = padded_tensors(outputs, prompt_length, response_length, pad_token_id)
    log_probs = _log_probs(outputs, tensors["response_mask"])
    if log_probs is not None:
        tensors["rollout_log_probs"] = log_probs
    scores = _scores(outputs, tensors["attention_mask"][:, prompt_length:])
    if scores is not None:
        tensors["rm_scores"] = scores
    extras = [dict(output.extra_fields) for output in outputs]
    keys = sorted({key for extra in extras for key in extra} | set(DEFAULT_EXTRA_KEYS))
    non_tensors = {key: _objects([extra.get(key) for extra in extras]) for key in keys}
    non_tensors["__num_turns__"] = np.array([output.num_turns for output in outputs], dtype=np.int32)
    non_tensors["tool_extra_fields"] = _objects(extras)
    return tensors, non_tensors
