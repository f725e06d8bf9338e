"""The ``gdpo`` reward manager (verl's name): the naive manager's scoring, for ``algorithm.adv_estimator=gdpo``.

GDPO normalises each reward component on its own (``algorithm.gdpo_reward_keys``); the components are the entries of
the scoring function's result dict, which the naive manager already returns as extra info (non-tensor keys of the
batch). As in verl's manager, a scoring function that returns a plain float also reports it as the component
``acc``.
"""

from __future__ import annotations

from typing import Any

from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.reward_manager.registry import register

__all__ = ["GDPORewardManager"]


@register("gdpo")
class GDPORewardManager(NaiveRewardManager):
    """:class:`NaiveRewardManager`, with a plain float score also reported as the reward component ``acc``."""

    def _parse_result(self, result: Any) -> tuple[float, dict]:
        if isinstance(result, dict):
            return super()._parse_result(result)
        return float(result), {"acc": float(result)}
