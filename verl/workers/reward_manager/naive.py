"""The ``naive`` reward manager: decode each response, score it with a rule, put the score on its last token.

This is the outcome-reward shape GRPO and PPO use here: ``token_level_scores`` is zero everywhere except at the
last valid response token of each sample (the eos when there is one), which holds the sample's scalar score. The
scorer is the built-in ``data_source`` dispatch unless a custom function is given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager.registry import register

logger = logging.getLogger(__name__)


def place_scores_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Spread per-sample scores into a token-level tensor, at the last valid response token.

    Args:
        scores: (B,) float, one score per sample.
        response_mask: (B, R) int/bool, 1 for response tokens (right-padded).

    Returns:
        (B, R) float32, zero except ``[i, last_valid_i] = scores[i]``; a sample with no valid token gets its
        score at position 0 so that no reward is silently dropped.
    """
    assert scores.dim() == 1 and response_mask.dim() == 2 and scores.shape[0] == response_mask.shape[0]
    num_valid = response_mask.long().sum(dim=-1)
    last = (num_valid - 1).clamp(min=0)
    token_level = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
    token_level[torch.arange(scores.shape[0], device=response_mask.device), last] = scores.float()
    return token_level


def agent_loop_extra_infos(non_tensor: dict, num_rows: int) -> np.ndarray:
    """Each sample's ``extra_info`` for the scorer. For multi-turn trajectories (a batch with verl's
    ``__num_turns__``) as verl's reward managers build it: the row's ``extra_info`` with the agent loop's extra
    fields (``tool_extra_fields``: ``tool_rewards``, ``turn_scores``, the tool-call counts...), ``num_turns`` and
    ``rollout_reward_scores`` (the ``reward_scores`` column, else ``{}``) added; otherwise the column as it is."""
    extra_infos = non_tensor.get("extra_info", np.full(num_rows, None, dtype=object))
    if "__num_turns__" not in non_tensor:
        return extra_infos
    merged = np.empty(num_rows, dtype=object)
    tool_fields = non_tensor.get("tool_extra_fields")
    reward_scores = non_tensor.get("reward_scores")
    for i in range(num_rows):
        info = dict(extra_infos[i]) if isinstance(extra_infos[i], dict) else {}
        if tool_fields is not None and isinstance(tool_fields[i], dict):
            info.update(tool_fields[i])
        info["num_turns"] = int(non_tensor["__num_turns__"][i])
        info["rollout_reward_scores"] = reward_scores[i] if reward_scores is not None else {}
        merged[i] = info
    return merged


class SampleScoringError(RuntimeError):
    """The scoring function raised on one sample of a batch; the original exception is its ``__cause__``.

    Attributes:
        position: the sample's row in the scored batch (0-based).
        data_source: the sample's data source (which picks the scorer).
    """

    def __init__(self, position: int, data_source: str, cause: BaseException):
        self.position = position
        self.data_source = data_source
        super().__init__(
            f"sample {position} of the batch (data_source {data_source!r}): {type(cause).__name__}: {cause}"
        )


@register("naive")
class NaiveRewardManager:
    """Score every response independently with a rule-based function.

    Args:
        tokenizer: the tokenizer used to decode responses (special tokens are skipped).
        num_examine: how many decoded samples per data source to log at INFO level per call (for eyeballing).
        compute_score: ``fn(data_source, solution_str, ground_truth, extra_info) -> float`` or a dict with a
            ``"score"`` entry (other entries are returned as extra info); default: the data_source dispatch.
        reward_fn_key: the non-tensor key that names each sample's data source.
    """

    def __init__(
        self,
        tokenizer,
        num_examine: int = 0,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
    ):
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key

    def _score_one(self, data_source: str, response: str, ground_truth: str, extra_info: Any) -> tuple[float, dict]:
        result = self.compute_score(
            data_source=data_source, solution_str=response, ground_truth=ground_truth, extra_info=extra_info
        )
        return self._parse_result(result)

    def _parse_result(self, result: Any) -> tuple[float, dict]:
        """A scoring function's result as (score, extra info): a float, or a dict with ``"score"`` and extras."""
        if isinstance(result, dict):
            if "score" not in result:
                raise ValueError(f"A reward function returned a dict without 'score': {sorted(result)}.")
            return float(result["score"]), {k: v for k, v in result.items() if k != "score"}
        return float(result), {}

    def __call__(self, data, return_dict: bool = False):
        """Score a batch.

        Args:
            data: a DataProto with tensors ``responses`` (B, R) and ``attention_mask`` (B, P+R) (or
                ``response_mask`` (B, R)), and non-tensors ``ground_truth`` and ``data_source`` (B,).
            return_dict: also return per-sample extra info.

        Returns:
            ``token_level_scores`` (B, R) float32; with ``return_dict``, ``{"reward_tensor": that,
            "reward_extra_info": {"score": [B floats], ...}}``.

        Raises:
            ValueError: a required key is missing from the batch.
            SampleScoringError: the scoring function raised on a sample (its position in the batch named).
        """
        responses = data.batch["responses"]
        non_tensor = data.non_tensor_batch
        multi_turn = "__num_turns__" in non_tensor and "attention_mask" in data.batch.keys()
        if "response_mask" in data.batch.keys() and not multi_turn:
            response_mask = data.batch["response_mask"]
        else:
            # verl's span of a response: every real id, a multi-turn response's tool turns (response_mask 0) included
            response_mask = data.batch["attention_mask"][:, -responses.shape[1] :]
        for key in ("ground_truth", self.reward_fn_key):
            if key not in non_tensor:
                raise ValueError(
                    f"The reward manager needs non-tensor key {key!r}; the batch has {sorted(non_tensor)}."
                )
        num_valid = response_mask.long().sum(dim=-1).tolist()
        extra_infos = agent_loop_extra_infos(non_tensor, len(responses))
        scores, extra = [], {}
        examined: dict[str, int] = {}
        for i, length in enumerate(num_valid):
            text = self.tokenizer.decode(responses[i, :length].tolist(), skip_special_tokens=True)
            source = str(non_tensor[self.reward_fn_key][i])
            try:
                score, info = self._score_one(source, text, str(non_tensor["ground_truth"][i]), extra_infos[i])
            except Exception as err:  # the user's scorer: which sample it failed on is what the trainer reports
                raise SampleScoringError(i, source, err) from err
            scores.append(score)
            for key, value in info.items():
                extra.setdefault(key, [None] * len(num_valid))[i] = value
            if examined.get(source, 0) < self.num_examine:
                examined[source] = examined.get(source, 0) + 1
                logger.info(
                    "[%s] response=%r ground_truth=%r score=%.3f", source, text, non_tensor["ground_truth"][i], score
                )
        reward_tensor = place_scores_on_last_token(torch.tensor(scores, dtype=torch.float32), response_mask)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": {"score": scores, **extra}}
        return reward_tensor
