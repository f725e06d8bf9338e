"""The trainer's roles in one process per rank, and the call that serves the actor and the critic at once.

:class:`ColocatedRolesWorker` is the base of the colocated worker class the trainer builds for the roles that share a
process (:func:`~verl.single_controller.colocated.create_colocated_worker_cls`, the layout from
:mod:`verl.workers.config.colocation`). What it adds to hosting them: :meth:`generate_with_log_probs_and_values`,
the actor's generation call (samples, old and reference log-probs) followed in the same process by the critic's
values of those samples, so that the sequences cross the driver once per step for the actor, the reference and
the critic instead of going out again for ``compute_values``.
"""

from __future__ import annotations

import time

from verl.protocol import DataProto
from verl.single_controller import Dispatch, register
from verl.single_controller.colocated import ColocatedWorker
from verl.workers.critic.base import VALUE_KEYS

ACTOR_ROLE, CRITIC_ROLE = "actor_rollout_ref", "critic"


class ColocatedRolesWorker(ColocatedWorker):
    """The trainer's roles hosted in one process (see the module)."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_with_log_probs_and_values(self, prompts: DataProto) -> DataProto:
        """The actor's ``generate_with_log_probs``, then the critic's ``compute_values`` on its output, joined: the
        output of the first plus ``values`` (B*n, R), and the critic's seconds as ``timing_s/values`` beside the
        actor's pass timings in ``meta_info["metrics"]``.

        Raises:
            ValueError: this process does not host both the actor and the critic.
        """
        batch = self.call_role(ACTOR_ROLE, "generate_with_log_probs", prompts)
        start = time.perf_counter()
        present = [key for key in VALUE_KEYS if key in batch.batch.keys()]
        values = self.call_role(
            CRITIC_ROLE, "compute_values", batch.select(batch_keys=present, non_tensor_batch_keys=[])
        )
        batch.batch["values"] = values.batch["values"]
        batch.meta_info["metrics"]["timing_s/values"] = time.perf_counter() - start
        return batch
