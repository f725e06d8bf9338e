"""How much a run trains: the batch, steps, epochs and validation frequency a step really uses.

The trainer's keys say it, except with a rollout group of its own, where verl's fully async keys take over
(:func:`step_sizes`). The config's own keys are never rewritten: the sizes are derived here, once, for the config's
cross-key checks and for the :class:`~verl.workers.config.plan.RunPlan`. This module sits below the config's
:class:`~verl.workers.config.PPOConfig` (which checks its rules on these sizes), so it takes the config as a value and
imports nothing of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StepSizes:
    """How much a run trains: the sizes :func:`step_sizes` derives (see :class:`RunPlan` for each field)."""

    train_batch_size: int
    total_training_steps: int | None
    total_epochs: int
    test_freq: int


def step_sizes(config: Any) -> StepSizes:
    """The sizes a run trains with: the trainer's keys, or verl's fully async ones with a rollout group of its own.

    ``config`` is a validated :class:`~verl.workers.config.PPOConfig`.

    With ``actor_rollout_ref.hybrid_engine=false`` (the rollout in a group of its own), verl's fully async keys
    take over from the trainer's: a step (a local update) trains on ``async_training.require_batches`` x
    ``actor.ppo_mini_batch_size`` prompts whatever ``data.train_batch_size`` says (verl's scripts set it to 0);
    ``rollout.total_rollout_steps`` (prompts generated over the run) gives ``total_training_steps`` (that many
    prompts in steps of ``train_batch_size``, at least 1); ``rollout.total_epochs`` gives ``total_epochs``; and
    ``rollout.test_freq`` (validations every that many weight syncs) gives ``test_freq`` (that many sync windows of
    ``async_training.trigger_parameter_sync_step`` steps). Each of them null, or the rollout in the actor workers:
    the trainer's key as written. The config itself is not changed.
    """
    data, trainer, group, rules = config.data, config.trainer, config.rollout, config.async_training
    sizes = StepSizes(data.train_batch_size, trainer.total_training_steps, trainer.total_epochs, trainer.test_freq)
    if not config.separate_rollout:  # nothing reads the async keys then (PPOConfig refuses them set)
        return sizes
    if rules.require_batches is not None:
        sizes = dataclasses.replace(
            sizes, train_batch_size=rules.require_batches * config.actor_rollout_ref.actor.ppo_mini_batch_size
        )
    if group.total_rollout_steps is not None and sizes.train_batch_size > 0:
        sizes = dataclasses.replace(
            sizes, total_training_steps=max(1, group.total_rollout_steps // sizes.train_batch_size)
        )
    if group.total_epochs is not None:
        sizes = dataclasses.replace(sizes, total_epochs=group.total_epochs)
    if group.test_freq is not None:
        sizes = dataclasses.replace(sizes, test_freq=group.test_freq * rules.trigger_parameter_sync_step)
    return sizes


def num_training_steps(sizes: StepSizes, num_train_prompts: int) -> int:
    """The steps a run makes over ``num_train_prompts``: ``total_training_steps`` when set, else the epochs' steps.

    Raises:
        ValueError: a step needs more prompts than there are.
    """
    steps_per_epoch = num_train_prompts // sizes.train_batch_size
    if steps_per_epoch < 1:
        raise ValueError(
            f"data.train_batch_size={sizes.train_batch_size} (the prompts of one step) is larger than the "
            f"{num_train_prompts} training prompts; lower it or add data."
        )
    if sizes.total_training_steps is None:
        return steps_per_epoch * sizes.total_epochs
    return sizes.total_training_steps
