"""Reward managers: from generated responses to ``token_level_scores``, chosen by ``reward_model.reward_manager``.

Public API: the registry functions (:func:`register_reward_manager`, :func:`get_reward_manager_cls`,
:func:`list_reward_managers`), :func:`load_custom_score_fn` for ``"module.path:function"`` scorers, and the
built-in :class:`NaiveRewardManager` (``naive``). Importing this package registers the built-ins.
"""

from verl.workers.reward_manager.naive import NaiveRewardManager, place_scores_on_last_token
from verl.workers.reward_manager.registry import (
    REWARD_MANAGER_REGISTRY,
    get_reward_manager_cls,
    list_reward_managers,
    load_custom_score_fn,
    register_reward_manager,
)

__all__ = [
    "REWARD_MANAGER_REGISTRY",
    "NaiveRewardManager",
    "get_reward_manager_cls",
    "list_reward_managers",
    "load_custom_score_fn",
    "place_scores_on_last_token",
    "register_reward_manager",
]
