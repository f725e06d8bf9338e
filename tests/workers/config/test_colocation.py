"""Tests for verl.workers.config.colocation: which roles share a worker process, and why the others do not."""

import pytest

from verl.workers.config.colocation import colocation_notes, worker_processes
from verl.workers.config.loading import compose_ppo_config
from verl.workers.config.plan import build_run_plan

GAE = ["algorithm.adv_estimator=gae"]
RM = ["reward_model.enable=true", "reward_model.model.path=/nonexistent/rm", "reward_model.micro_batch_size_per_gpu=4"]
ALL = ("actor_rollout_ref", "critic", "reward_model")


def layout(*overrides: str):
    config = compose_ppo_config(list(overrides))
    return worker_processes(config), colocation_notes(config)


def test_the_default_grpo_run_is_the_actor_alone():
    assert layout() == ((("actor_rollout_ref",),), [])


def test_actor_critic_and_reward_model_share_one_process_and_the_plan_says_so():
    config = compose_ppo_config([*GAE, *RM])
    assert worker_processes(config) == (ALL,)
    assert colocation_notes(config) == []
    assert build_run_plan(config).worker_processes == (ALL,)


def test_colocate_roles_false_gives_each_role_a_process_of_its_own():
    processes, notes = layout(*GAE, *RM, "trainer.colocate_roles=false")
    assert processes == (("actor_rollout_ref",), ("critic",), ("reward_model",))
    assert notes == [
        "critic: a process of its own (trainer.colocate_roles=false)",
        "reward_model: a process of its own (trainer.colocate_roles=false)",
    ]


def test_another_collective_timeout_keeps_the_actor_apart_and_the_others_together():
    # the actor's group waits 30 s (actor_rollout_ref.nccl_timeout), the critic's and the reward model's 600 s
    processes, notes = layout(*GAE, *RM, "actor_rollout_ref.nccl_timeout=30")
    assert processes == (("actor_rollout_ref",), ("critic", "reward_model"))
    assert (
        "critic: not in the actor's process, because their collective timeouts differ (actor_rollout_ref 30 s"
        in (notes[0])
    )


def test_a_megatron_critic_beside_an_actor_without_megatron_gets_its_own_process():
    processes, notes = layout(*GAE, *RM, "critic.strategy=megatron")
    assert processes == (("actor_rollout_ref", "reward_model"), ("critic",))
    assert notes == [
        "critic: not in the actor's process, because actor_rollout_ref runs without megatron and critic megatron "
        "at tp=1, pp=1; megatron-core holds one parallel layout per process"
    ]


@pytest.mark.parametrize(("critic_tp", "expected"), [(1, (("actor_rollout_ref", "critic"),)), (2, None)])
def test_megatron_roles_share_a_process_only_at_the_same_parallel_sizes(critic_tp, expected):
    megatron = ["actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron", "trainer.n_gpus_per_node=2"]
    sizes = ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1"]
    sizes.append(f"critic.megatron.tensor_model_parallel_size={critic_tp}")
    processes, _ = layout(*GAE, *megatron, *sizes)
    # tp 1 and tp 2 over 2 ranks: megatron-core's groups would differ, so the critic goes apart
    assert processes == (expected or (("actor_rollout_ref",), ("critic",)))
