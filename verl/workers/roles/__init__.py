"""The roles a worker hosts: plain objects holding one model and what can be done with it.

A worker (``verl.workers.*_worker*``) is built from the roles it hosts and exposes to its group only the methods of
those roles, plus the lifecycle every worker has. :class:`~verl.workers.roles.rollout.RolloutRole` samples responses
from a policy; the actor, the reference and the critic are the backends' own objects
(:class:`~verl.workers.actor.base.BasePPOActor`, :class:`~verl.workers.critic.base.BasePPOCritic`).
"""

from verl.workers.roles.rollout import RolloutRole, build_rollout_role, evaluating

__all__ = ["RolloutRole", "build_rollout_role", "evaluating"]
