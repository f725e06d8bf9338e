"""The run's worker groups as a named value, the CPU thread split over every process a node holds, and what keeps
Ray's and transformers' own messages out of a run's output (the token-authentication notice, the workers' weight
loading bars)."""

import os
import sys

import pytest

from verl.trainer.ray_setup import (
    WorkerGroups,
    ask_for_token_auth,
    processes_per_node,
    ray_init_kwargs,
    threads_per_process,
)
from verl.workers.config import compose_ppo_config, compose_with_defaults

REWARD_MODEL = ["reward_model.enable=true", "reward_model.model.path=unused", "reward_model.micro_batch_size_per_gpu=8"]


def test_two_cores_over_actor_critic_and_reward_model_in_one_process_give_it_both():
    config = compose_ppo_config(["trainer.n_gpus_per_node=1", "algorithm.adv_estimator=gae", *REWARD_MODEL])
    # actor, critic and reward model share the rank's one process (they take turns): 2 cores // 1 = 2
    assert processes_per_node(config) == 1
    assert threads_per_process(2, processes_per_node(config)) == 2


def test_two_cores_over_actor_critic_and_reward_model_apart_give_one_thread_each():
    overrides = ["trainer.n_gpus_per_node=1", "algorithm.adv_estimator=gae", "trainer.colocate_roles=false"]
    config = compose_ppo_config([*overrides, *REWARD_MODEL])
    # actor 1 rank + critic 1 rank + reward model 1 rank = 3 processes; 2 cores // 3 = 0, raised to 1
    assert processes_per_node(config) == 3
    assert threads_per_process(2, processes_per_node(config)) == 1


def test_eight_cores_over_two_actor_and_two_critic_ranks_apart_give_two_threads_each():
    config = compose_ppo_config(
        ["trainer.n_gpus_per_node=2", "algorithm.adv_estimator=gae", "actor_rollout_ref.nccl_timeout=60"]
    )
    # another collective timeout keeps the critic apart: 2 actor ranks + 2 critic ranks = 4 processes; 8 // 4 = 2
    assert processes_per_node(config) == 4
    assert threads_per_process(8, processes_per_node(config)) == 2


def test_a_rollout_group_of_its_own_counts_its_ranks_on_the_node():
    config = compose_ppo_config(["trainer.n_gpus_per_node=2", "actor_rollout_ref.hybrid_engine=false"])
    # 2 actor ranks + rollout.n_gpus_per_node (1) rollout rank = 3 processes; 7 cores // 3 = 2
    assert processes_per_node(config) == 2 + config.rollout.n_gpus_per_node == 3
    assert threads_per_process(7, 3) == 2


@pytest.mark.parametrize("cores, processes, expected", [(1, 4, 1), (16, 3, 5), (4, 0, 4)])
def test_threads_per_process_is_the_floor_of_the_share_and_at_least_one(cores, processes, expected):
    # 1 // 4 = 0 -> 1; 16 // 3 = 5; no process counted is read as one
    assert threads_per_process(cores, processes) == expected


def test_worker_groups_name_what_exists_and_iterate_over_it_in_start_order():
    groups = WorkerGroups(actor_rollout_ref="actor", reward_model="rm")
    assert not groups.has_critic and groups.has_reward_model and not groups.has_rollout_group
    assert list(groups) == ["actor", "rm"]
    full = WorkerGroups("actor", "critic", "rm", "rollout")
    assert full.has_critic and full.has_rollout_group and list(full) == ["actor", "critic", "rm", "rollout"]


@pytest.mark.parametrize(
    "overrides, preset, expected",
    [
        ([], None, "token"),  # a local instance: Ray's own default, asked for by name (no warning)
        ([], "disabled", "disabled"),  # the user's choice stays
        (["ray_init.address=auto"], None, None),  # joining a cluster: its own setting, nothing asked for
        (["+ray_kwargs.ray_init.address=10.0.0.1:6379"], None, None),  # verl's spelling of the address
    ],
    ids=["local", "user", "cluster", "cluster-verl-key"],
)
def test_token_authentication_is_asked_for_by_name_for_a_local_instance_only(monkeypatch, overrides, preset, expected):
    composed = compose_with_defaults(overrides).config  # as the command line composes it, before the check
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # Ray reads the variable when imported: not yet here
    monkeypatch.setenv("RAY_AUTH_MODE", "recorded")  # monkeypatch puts back the variable's state before this
    if preset is None:
        monkeypatch.delenv("RAY_AUTH_MODE")
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", preset)
    ask_for_token_auth(composed)
    assert os.environ.get("RAY_AUTH_MODE") == expected


def test_an_already_imported_ray_keeps_its_default(monkeypatch):
    import ray  # noqa: F401  (imported: too late to ask)

    monkeypatch.setenv("RAY_AUTH_MODE", "recorded")
    monkeypatch.delenv("RAY_AUTH_MODE")
    ask_for_token_auth(compose_with_defaults([]).config)
    assert "RAY_AUTH_MODE" not in os.environ


def test_workers_load_weights_without_progress_bars_unless_the_user_wants_them(monkeypatch):
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    env_vars = ray_init_kwargs(compose_ppo_config([]))["runtime_env"]["env_vars"]
    assert env_vars["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    assert ray_init_kwargs(compose_ppo_config([]))["runtime_env"]["env_vars"]["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"
