"""A worker receives its own config section and the run plan, never the whole config.

Every worker class's constructor is typed with its section, the :class:`~verl.workers.config.plan.RunPlan` and what
it reads of other sections; :meth:`~verl.workers.base_worker.SectionWorker.from_config` builds a worker from a
whole config (tests, scripts), and ``init_kwargs`` is what its worker group passes to the constructor.
"""

import dataclasses
import inspect
import typing

import pytest

from tests.workers.test_worker_registry import WORKER_CLASSES
from verl.workers.config import PPOConfig, compose_ppo_config
from verl.workers.config.plan import build_run_plan, resolve_device
from verl.workers.dp_workers import DPActorRolloutRefWorker, DPCriticWorker
from verl.workers.reward_model import RewardModelWorker
from verl.workers.rollout_worker import RolloutWorker


def mentions(hint, target: type) -> bool:
    """Whether the type hint ``hint`` is ``target`` or a union / generic holding it."""
    return hint is target or any(mentions(arg, target) for arg in typing.get_args(hint))


@pytest.mark.parametrize("cls", WORKER_CLASSES, ids=lambda cls: cls.__name__)
def test_no_worker_constructor_takes_the_whole_config(cls):
    hints = typing.get_type_hints(cls.__init__)
    parameters = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
    # every parameter is typed (an untyped one could take anything), none with PPOConfig
    assert set(parameters) <= set(hints), (cls.__name__, parameters, hints)
    assert not any(mentions(hint, PPOConfig) for hint in hints.values()), (cls.__name__, hints)
    assert "plan" in parameters and "total_training_steps" not in parameters


def test_an_actor_worker_from_a_config_holds_its_section_and_the_resolved_plan():
    import torch

    config = compose_ppo_config(["trainer.device=auto", "actor_rollout_ref.actor.strategy=dp"])
    worker = DPActorRolloutRefWorker.from_config(config, total_training_steps=3)
    assert worker.config is config.actor_rollout_ref
    # the driver's plan, with auto resolved as this process sees it (no CUDA here: cpu) and the given step count
    resolved = resolve_device(build_run_plan(config), config, torch.cuda.is_available())
    assert worker.plan.device != "auto"
    assert worker.plan == dataclasses.replace(resolved, total_training_steps=3)
    assert worker.total_training_steps == 3


def test_each_worker_group_gets_its_own_section():
    config = compose_ppo_config(
        [
            "algorithm.adv_estimator=gae",
            "reward_model.enable=true",
            "reward_model.model.path=unused",
            "reward_model.micro_batch_size_per_gpu=8",
        ]
    )
    plan = build_run_plan(config)
    expected = {
        DPActorRolloutRefWorker: config.actor_rollout_ref,
        DPCriticWorker: config.critic,
        RewardModelWorker: config.reward_model,
        RolloutWorker: config.actor_rollout_ref,
    }
    for cls, section in expected.items():
        kwargs = cls.init_kwargs(config, plan)
        assert kwargs["config"] is section and kwargs["plan"] is plan, cls.__name__
        assert not any(isinstance(value, PPOConfig) for value in kwargs.values()), cls.__name__
    # the critic reads the responses per prompt from the plan, not from actor_rollout_ref
    critic = DPCriticWorker(**DPCriticWorker.init_kwargs(config, plan))
    assert critic.plan.rollout_n == config.actor_rollout_ref.rollout.n
