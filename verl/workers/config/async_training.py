"""``async_training``: how far the rollout worker group of its own may run ahead of the trainer.

Read only with ``actor_rollout_ref.hybrid_engine=false`` (a rollout group of its own). The defaults are one step off
policy; verl's fully async trainer (``python -m verl.experimental.fully_async_policy.fully_async_main``, config
``fully_async_ppo_trainer``) sets its own. The rules, as verl states them:

- a local update trains on ``require_batches`` x ``actor.ppo_mini_batch_size`` prompts (null: ``data.train_batch_size``
  prompts, one step as in the synchronous trainer);
- the trainer sends its weights to the rollout group after every ``trigger_parameter_sync_step`` local updates (one
  new weight version per sync);
- between two syncs the rollout group generates at most ``(1 + staleness_threshold) x trigger_parameter_sync_step``
  local updates' worth of prompts, less what it generated earlier that is still waiting: 0 is synchronous training
  (each sync's batches are sampled by the newest weights), 1 with one update per sync is one step off policy;
- ``partial_rollout``: responses still being generated when new weights arrive are cut there and continue with the
  new weights, their tokens carrying the version that produced each.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from verl.workers.config.schema import BaseConfig, FieldError, check_int, check_number


@dataclasses.dataclass(frozen=True)
class AsyncTrainingConfig(BaseConfig):
    """``async_training``: staleness, sync frequency, local-update size and partial rollouts."""

    KEY: ClassVar[str] = "async_training"

    staleness_threshold: float
    trigger_parameter_sync_step: int
    require_batches: int | None
    partial_rollout: bool
    use_rollout_log_probs: bool | None
    compute_prox_log_prob: bool
    use_trainer_do_validate: bool

    def check(self) -> None:
        check_number(self, "staleness_threshold", 0.0)
        check_int(self, "trigger_parameter_sync_step", 1)
        check_int(self, "require_batches", 1)
        if self.use_trainer_do_validate:
            raise FieldError(
                "use_trainer_do_validate",
                "=true validates on the trainer's workers, which hold no rollout here (it lives in the rollout "
                "group, which validates with the newest weights); set it to false.",
            )
