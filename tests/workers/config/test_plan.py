"""The run plan: what a validated config implies, derived without changing the config, and resolved once."""

import dataclasses

import pytest

from verl.workers.config import PPOConfig, RunPlan, build_run_plan, compose_ppo_config, resolve_device
from verl.workers.config.plan import num_training_steps, role_profiler_settings, standalone_plan, step_sizes

FULLY_ASYNC = [
    "actor_rollout_ref.hybrid_engine=false",
    "data.train_batch_size=0",  # verl's fully async scripts: require_batches sizes a step instead
    "async_training.require_batches=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "rollout.total_rollout_steps=320",
    "rollout.total_epochs=3",
    "rollout.test_freq=2",
    "async_training.trigger_parameter_sync_step=5",
]


@pytest.fixture(scope="module")
def default_config() -> PPOConfig:
    return compose_ppo_config()


def test_the_embedded_runs_plan_by_hand(default_config):
    # embedded layer: 960 prompts in steps of 16 -> 60 steps an epoch, 1 epoch; test_freq 10; GRPO, no KL: no
    # reference, no critic; ppo_epochs 1 and mini-batch 16 == batch 16: one update, so no old-log-prob pass
    plan = build_run_plan(default_config, num_train_prompts=960)
    assert isinstance(plan, RunPlan)
    assert (plan.train_batch_size, plan.total_training_steps, plan.total_epochs, plan.test_freq) == (16, 60, 1, 10)
    # trainer.device is auto by default: decided once Ray starts, on the cluster's GPUs (test_plan_device.py)
    assert (plan.device, plan.world_size) == ("auto", 1)
    assert plan.roles == ("actor", "rollout")
    assert not (plan.needs_reference or plan.needs_critic or plan.computes_old_log_prob)
    assert plan.critic_strategy is None and plan.megatron_optimizer == {}
    assert not (plan.separate_rollout or plan.prox_log_prob_pass or plan.uses_rollout_log_probs_as_old)
    # without the prompt count the step count is what the config says: null, the epochs decide
    assert build_run_plan(default_config).total_training_steps is None


def test_fully_async_sizes_come_from_verls_keys_and_leave_the_config_as_written():
    config = compose_ppo_config(FULLY_ASYNC)
    plan = build_run_plan(config)
    assert plan.train_batch_size == 32  # require_batches 4 x ppo_mini_batch_size 8
    assert plan.total_training_steps == 10  # total_rollout_steps 320 // 32 prompts a step
    assert plan.total_epochs == 3  # rollout.total_epochs
    assert plan.test_freq == 10  # rollout.test_freq 2 sync windows x trigger_parameter_sync_step 5
    assert plan.separate_rollout
    # mini-batch 8 < 32 prompts a step: several updates a step, so the old-log-prob pass runs
    assert plan.computes_old_log_prob
    # the config is what the user wrote: validation derived the sizes, it did not write them back
    assert config.data.train_batch_size == 0
    assert config.trainer.total_training_steps is None
    assert (config.trainer.total_epochs, config.trainer.test_freq) == (1, 10)
    assert step_sizes(config).train_batch_size == 32


def test_the_trainers_keys_apply_with_the_rollout_in_the_actor_workers(default_config):
    sizes = step_sizes(default_config)
    assert (sizes.train_batch_size, sizes.total_training_steps, sizes.total_epochs, sizes.test_freq) == (
        16,
        None,
        1,
        10,
    )


def test_step_count_from_the_prompts():
    sizes = step_sizes(compose_ppo_config(["trainer.total_epochs=3"]))
    assert num_training_steps(sizes, 100) == 18  # 100 // 16 = 6 steps an epoch x 3 epochs (4 prompts left over)
    assert num_training_steps(dataclasses.replace(sizes, total_training_steps=7), 100) == 7  # set: as set
    with pytest.raises(ValueError, match=r"data.train_batch_size=16 .* larger than the 15 training prompts"):
        num_training_steps(sizes, 15)


def test_auto_device_is_resolved_once_on_the_clusters_gpus():
    config = compose_ppo_config(["trainer.device=auto"])
    before_ray = build_run_plan(config)
    assert before_ray.device == "auto"
    assert resolve_device(before_ray, config, cluster_gpus=1).device == "cuda"  # one rank, one GPU
    on_cpu = resolve_device(before_ray, config, cluster_gpus=0)
    assert on_cpu == dataclasses.replace(before_ray, device="cpu")  # nothing else changes
    # a plan whose device is cpu stays as it is, whatever the cluster has
    assert resolve_device(on_cpu, config, cluster_gpus=1).device == "cpu"


def test_the_megatron_optimizer_follows_the_resolved_device():
    config = compose_ppo_config(["trainer.device=auto", "actor_rollout_ref.actor.strategy=megatron"])
    before_ray = build_run_plan(config)
    assert before_ray.megatron_optimizer == {"actor": None}  # decided with the device
    # use_megatron_optimizer=auto: megatron-core's optimizer on CUDA, the torch.optim adapter on CPU
    assert resolve_device(before_ray, config, cluster_gpus=1).megatron_optimizer == {"actor": True}
    assert resolve_device(before_ray, config, cluster_gpus=0).megatron_optimizer == {"actor": False}


def test_a_single_logger_becomes_a_list_while_the_section_is_built():
    config = compose_ppo_config(["trainer.logger=console"])
    assert config.trainer.logger == ["console"]
    # nothing rewrites a built section afterwards: a string set by hand is a type error, not silently a list
    with pytest.raises(ValueError, match="logger"):
        config.trainer.replace(logger="console")


def test_the_plan_is_plain_values_for_the_log_and_the_checkpoint(default_config):
    plan = build_run_plan(default_config, num_train_prompts=960)
    values = plan.to_dict()
    assert values["train_batch_size"] == 16 and values["roles"] == ("actor", "rollout")
    assert "  total_training_steps: 60" in plan.describe().splitlines()


def test_the_plan_carries_what_workers_read_from_sections_other_than_their_own():
    # rollout.n sizes the actor's and the critic's per-rank mini-batches; partial_rollout switches the rollout
    # group's weights mid-generation (it needs the naive rollout and a rollout group of its own)
    plain = build_run_plan(compose_ppo_config(["actor_rollout_ref.rollout.n=2"]))
    assert (plain.rollout_n, plain.partial_rollout) == (2, False)
    partial = compose_ppo_config(
        [
            "actor_rollout_ref.hybrid_engine=false",
            "async_training.partial_rollout=true",
            "actor_rollout_ref.rollout.n=8",
        ]
    )
    assert (build_run_plan(partial).rollout_n, build_run_plan(partial).partial_rollout) == (8, True)


def test_a_standalone_plan_resolves_auto_on_this_process_and_takes_the_step_count():
    import torch

    config = compose_ppo_config(["trainer.device=auto"])
    here = "cuda" if torch.cuda.is_available() else "cpu"
    plan = standalone_plan(config, total_training_steps=5)
    # only the device (auto -> this process's) and the step count (None in the config -> 5) differ from the driver's
    assert plan == dataclasses.replace(build_run_plan(config), device=here, total_training_steps=5)
    assert standalone_plan(config).total_training_steps is None  # not given: the config's (null)


def test_a_groups_profiler_settings_are_its_roles_sections():
    config = compose_ppo_config(["actor_rollout_ref.actor.use_kl_loss=true", "algorithm.adv_estimator=gae"])
    arr = config.actor_rollout_ref
    # the actor group holds the actor and the reference: both sections; the critic's own; other groups none
    actor = role_profiler_settings(config, "actor_rollout_ref")
    assert actor.sections == (arr.actor.profiler, arr.ref.profiler) and actor.global_profiler is config.global_profiler
    assert role_profiler_settings(config, "critic").sections == (config.critic.profiler,)
    assert role_profiler_settings(config, "rollout").sections == () and not actor.enabled
