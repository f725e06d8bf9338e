"""The ``dapo`` reward manager: the ``naive`` scores plus DAPO's soft penalty on overlong responses.

DAPO (Yu et al., 2025, arXiv:2503.14476) punishes a response that runs into the last ``overlong_buffer.len`` tokens
of ``data.max_response_length``: the penalty grows linearly from 0, at ``max_resp_len - len`` tokens, to
``penalty_factor`` at ``max_resp_len``, and is added to the sample's score on its last token. A truncated response
then earns less than one that ended in time, without the all-or-nothing cliff of a hard length limit. As in verl, a
scorer that returns a plain number also reports it as ``acc`` (the key DAPO's group filter reads by default), and
with ``overlong_buffer.log`` the penalty is reported as ``overlong_reward`` and ``overlong``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from verl.utils.errors import ValidationError
from verl.workers.reward_manager.naive import NaiveRewardManager, place_scores_on_last_token
from verl.workers.reward_manager.registry import register


def _setting(config: Any, key: str) -> Any:
    return config[key] if isinstance(config, Mapping) else getattr(config, key)


def overlong_penalty(response_length: torch.Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float):
    """(B,) float penalties <= 0: -(length - (max_resp_len - buffer_len)) / buffer_len * penalty_factor, capped at 0.

    Args:
        response_length: (B,) valid response tokens of each sample.
        max_resp_len: the longest response (``data.max_response_length``).
        buffer_len: the buffer at its end where the penalty grows.
        penalty_factor: the penalty of a response of ``max_resp_len`` tokens.
    """
    exceed = response_length.float() - (max_resp_len - buffer_len)
    return (-exceed / buffer_len * penalty_factor).clamp(max=0.0)


@register("dapo")
class DAPORewardManager(NaiveRewardManager):
    """Scores as :class:`NaiveRewardManager`, with DAPO's overlong penalty when ``overlong_buffer_cfg.enable``.

    Args:
        tokenizer, num_examine, compute_score, reward_fn_key: as for :class:`NaiveRewardManager`.
        max_resp_len: ``data.max_response_length``; required with the penalty.
        overlong_buffer_cfg: ``reward_model.overlong_buffer`` (``enable``, ``len``, ``penalty_factor``, ``log``), an
            object or a mapping; None: no penalty.

    Raises:
        ValidationError: the penalty is on without ``max_resp_len``, with ``len <= 0``, or with ``len`` above
            ``max_resp_len`` (a ``ValueError`` that is also an ``AssertionError``, as verl asserts).
    """

    def __init__(
        self,
        tokenizer,
        num_examine: int = 0,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
        max_resp_len: int | None = None,
        overlong_buffer_cfg: Any = None,
    ):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key)
        self.max_resp_len = max_resp_len
        self.overlong_buffer_cfg = overlong_buffer_cfg
        if self._penalty_on():
            buffer_len = _setting(overlong_buffer_cfg, "len")
            if max_resp_len is None:
                raise ValidationError(
                    "the dapo reward manager's overlong penalty needs max_resp_len (data.max_response_length); "
                    "pass it, or set reward_model.overlong_buffer.enable=false."
                )
            if not buffer_len > 0:
                raise ValidationError(
                    f"reward_model.overlong_buffer.len must be > 0 with the penalty on, got {buffer_len}; set it, or "
                    "set reward_model.overlong_buffer.enable=false."
                )
            if max_resp_len < buffer_len:
                raise ValidationError(
                    f"max_resp_len must be larger than overlong_buffer.len: data.max_response_length={max_resp_len} "
                    f"< reward_model.overlong_buffer.len={buffer_len}; shorten the buffer."
                )

    def _penalty_on(self) -> bool:
        return self.overlong_buffer_cfg is not None and bool(_setting(self.overlong_buffer_cfg, "enable"))

    def _score_one(self, data_source: str, response: str, ground_truth: str, extra_info: Any) -> tuple[float, dict]:
        score, info = super()._score_one(data_source, response, ground_truth, extra_info)
        return score, (info if info else {"acc": score})

    def __call__(self, data, return_dict: bool = False):
        """Score a batch as :meth:`NaiveRewardManager.__call__` does, then add the overlong penalty."""
        result = super().__call__(data, return_dict=True)
        reward_tensor, extra = result["reward_tensor"], result["reward_extra_info"]
        if self._penalty_on():
            responses = data.batch["responses"]
            if "response_mask" in data.batch.keys():
                mask = data.batch["response_mask"]
            else:
                mask = data.batch["attention_mask"][:, -responses.shape[1] :]
            cfg = self.overlong_buffer_cfg
            penalty = overlong_penalty(
                mask.sum(-1), self.max_resp_len, _setting(cfg, "len"), float(_setting(cfg, "penalty_factor"))
            )
            reward_tensor = reward_tensor + place_scores_on_last_token(penalty, mask)
            if _setting(cfg, "log"):
                extra["overlong_reward"] = penalty.tolist()
                extra["overlong"] = (penalty < 0).tolist()
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra}
        return reward_tensor
