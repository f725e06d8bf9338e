"""Reward managers: from generated responses to ``token_level_scores``, chosen by ``reward_model.reward_manager``.

Public API (verl's names): the registry functions :func:`register` (alias :func:`register_reward_manager`),
:func:`get_reward_manager_cls` and :func:`list_reward_managers`; the custom-scorer loaders
:func:`load_custom_score_fn` (``"module.path:function"`` strings) and :func:`load_custom_reward_function` (verl's
``custom_reward_function.path`` + ``.name``); and the built-ins :class:`NaiveRewardManager` (``naive``),
:class:`DAPORewardManager` (``dapo``: with DAPO's overlong penalty) and :class:`GDPORewardManager` (``gdpo``: the
naive scoring, a float score also reported as the component ``acc``). Importing this package registers the built-ins.
A scoring function that raises is reported as :class:`SampleScoringError`, which names the sample it failed on.
"""

from verl.workers.reward_manager.dapo import DAPORewardManager
from verl.workers.reward_manager.gdpo import GDPORewardManager
from verl.workers.reward_manager.naive import NaiveRewardManager, SampleScoringError, place_scores_on_last_token
from verl.workers.reward_manager.registry import (
    REWARD_MANAGER_REGISTRY,
    get_reward_manager_cls,
    list_reward_managers,
    load_custom_reward_function,
    load_custom_score_fn,
    register,
    register_reward_manager,
)

__all__ = [
    "REWARD_MANAGER_REGISTRY",
    "DAPORewardManager",
    "GDPORewardManager",
    "NaiveRewardManager",
    "SampleScoringError",
    "get_reward_manager_cls",
    "list_reward_managers",
    "load_custom_reward_function",
    "load_custom_score_fn",
    "place_scores_on_last_token",
    "register",
    "register_reward_manager",
]
