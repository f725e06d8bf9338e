"""PPO critics (value models) for both backends, trained under the actor's loop and optimizer-step contract.

``build_dp_critic`` and ``build_megatron_critic`` are what the workers call; both return a critic with
``compute_values(data) -> (B, R)`` and ``update_critic(data) -> UpdateResult``, whose failed updates go to the handler
from ``critic.update_failure_policy`` (role ``"critic"``, ``critic/...`` metrics, state in the critic checkpoint).
The megatron module is imported lazily, so that the dp critic does not pull in megatron-core.
"""

from verl.workers.critic.base import CRITIC_UPDATE_KEYS, BasePPOCritic, response_values
from verl.workers.critic.dp_critic import DataParallelPPOCritic, ValueModel, build_dp_critic

__all__ = [
    "CRITIC_UPDATE_KEYS",
    "BasePPOCritic",
    "DataParallelPPOCritic",
    "ValueModel",
    "build_dp_critic",
    "response_values",
]
