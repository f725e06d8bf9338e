"""main_ppo's multi-node and restart helpers, in this process and without a Ray cluster.

Joining a cluster, sizing the workers' CPU share from the cluster's nodes, choosing the checkpoint a restart
resumes from, and the message a run stops with when a worker died. The runs themselves (two nodes, killed
workers, restarts) are in ``tests/special_e2e/test_multinode.py``.
"""

import pytest
import ray

from tests.trainer.test_main_ppo import write_checkpoint
from verl.single_controller import WorkerDiedError
from verl.trainer import main_ppo
from verl.trainer.main_ppo import checkpoint_after_death, cpus_per_worker, describe_death, start_ray
from verl.trainer.ray_setup import worker_env_vars
from verl.workers.config import PPOConfig, compose_omegaconf


def typed(tmp_path, *overrides: str) -> PPOConfig:
    return PPOConfig.from_omegaconf(compose_omegaconf([f"trainer.default_local_dir={tmp_path / 'out'}", *overrides]))


def test_joining_a_cluster_with_a_local_cpu_count_is_refused_before_ray_starts(tmp_path):
    config = typed(tmp_path, "ray_init.address=auto", "ray_init.num_cpus=2")
    with pytest.raises(ValueError, match=r"ray_init.num_cpus=2 .* ray_init.address='auto'.*ray_init.num_cpus=null"):
        start_ray(config)
    assert not ray.is_initialized()


def fake_nodes(monkeypatch, cpus: list[float], dead: list[float] = (), gpus: list[float] = ()) -> None:
    nodes = [{"Alive": True, "Resources": {"CPU": c, "GPU": g}} for c, g in zip(cpus, [*gpus] + [0.0] * len(cpus))]
    nodes += [{"Alive": False, "Resources": {"CPU": c}} for c in dead]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)


def test_cpu_share_follows_the_nodes_that_hold_the_ranks(monkeypatch):
    fake_nodes(monkeypatch, [8.0, 1.0], dead=[64.0])  # a dead node's CPUs do not count
    # 2 nodes wanted: the second largest alive node (1 CPU) bounds the share; 2 workers there get 0.5 each
    assert cpus_per_worker(2, 2) == 0.5
    # 1 node wanted: the largest (8 CPUs) holds 2 workers at the cap of 1 CPU each
    assert cpus_per_worker(1, 2) == 1.0
    # 40 workers on a 1-CPU node: 1/40 is below the floor of 0.1, which the placement then refuses clearly
    assert cpus_per_worker(2, 40) == 0.1


def test_on_a_gpu_run_a_cpu_only_head_node_does_not_set_the_cpu_share(monkeypatch):
    # a 64-CPU head without GPUs and a 16-CPU node with 8 GPUs; 8 GPU ranks x 3 groups = 24 workers on that node:
    # 16 / 24 each (the head's 64 CPUs would give 1 each, 24 CPUs that the GPU node does not have)
    fake_nodes(monkeypatch, [64.0, 16.0], gpus=[0.0, 8.0])
    assert cpus_per_worker(1, 24, gpus_per_node=8) == pytest.approx(16 / 24)
    assert cpus_per_worker(1, 24) == 1.0  # a CPU run: every node may hold ranks


def test_nccl_blocking_wait_is_an_environment_variable_of_every_worker_only_when_asked():
    assert worker_env_vars(PPOConfig.from_omegaconf(compose_omegaconf()).trainer) == {}
    config = PPOConfig.from_omegaconf(compose_omegaconf(["trainer.nccl_blocking_wait=true"]))
    assert worker_env_vars(config.trainer) == {"TORCH_NCCL_BLOCKING_WAIT": "1"}


def test_restart_in_auto_mode_takes_the_newest_complete_checkpoint(tmp_path):
    config = typed(tmp_path)  # resume_mode: auto
    write_checkpoint(tmp_path / "out", 2)
    newest = write_checkpoint(tmp_path / "out", 4)
    # chosen again as at start-up, whatever the run last knew of
    assert checkpoint_after_death(config, last_good=None) == newest


def test_restart_without_auto_mode_takes_the_runs_own_last_checkpoint(tmp_path):
    config = typed(tmp_path, "trainer.resume_mode=disable")
    write_checkpoint(tmp_path / "out", 6)  # an older run's: disable ignores it
    mine = write_checkpoint(tmp_path / "out", 2)
    assert checkpoint_after_death(config, last_good=mine) == mine
    assert checkpoint_after_death(config, last_good=None) is None  # nothing saved yet: start over


def test_stop_message_names_role_rank_node_and_checkpoint(tmp_path):
    err = WorkerDiedError("critic", 3, "ab12", "10.0.0.7", "The actor is dead because its worker process has died.")
    message = describe_death(err, tmp_path / "global_step_8", restarts=0, max_restarts=0)
    assert message.startswith("A worker died: role critic, rank 3, node ab12 (10.0.0.7). The actor is dead")
    assert f"Last good checkpoint: {tmp_path / 'global_step_8'} (intact;" in message
    assert "set trainer.max_restarts=N" in message
    # restarts used up: the count, and no advice to set what is already set
    message = describe_death(err, None, restarts=2, max_restarts=2)
    assert "Last good checkpoint: none" in message and "Restarts used: 2 of trainer.max_restarts=2." in message
    assert "set trainer.max_restarts=N" not in message


class RecordingLoader:
    """Stands in for the training loader: records the state a restart puts it back to."""

    def __init__(self) -> None:
        self.loaded = []

    def load_state_dict(self, state) -> None:
        self.loaded.append(state)


DIED = WorkerDiedError("actor_rollout_ref", 1, "ab12", "10.0.0.7", "its worker process has died")


def test_restart_rule_gives_up_with_exit_4_when_no_restart_is_left(tmp_path, caplog):
    config = typed(tmp_path)  # trainer.max_restarts: 0
    attempts = main_ppo._Attempts(resume_from=None, last_good=None)
    with caplog.at_level("ERROR", logger="verl.trainer"):
        code = main_ppo._restart_after_death(DIED, config, RecordingLoader(), {"position": 0}, attempts)
    assert code == main_ppo.EXIT_WORKER_DIED and attempts.restarts == 0
    assert "A worker died: role actor_rollout_ref, rank 1" in caplog.text


def test_restart_rule_counts_and_resumes_from_the_newest_checkpoint_or_the_start(tmp_path):
    config = typed(tmp_path, "trainer.max_restarts=2")
    loader, fresh = RecordingLoader(), {"position": 0}
    attempts = main_ppo._Attempts(resume_from=None, last_good=None)
    # nothing saved yet: restart 1 starts over, the data loader put back to its fresh state
    assert main_ppo._restart_after_death(DIED, config, loader, fresh, attempts) is None
    assert (attempts.restarts, attempts.resume_from, loader.loaded) == (1, None, [fresh])
    # a checkpoint since: restart 2 resumes from it (auto mode) and leaves the loader to the checkpoint
    newest = write_checkpoint(tmp_path / "out", 2)
    assert main_ppo._restart_after_death(DIED, config, loader, fresh, attempts) is None
    assert (attempts.restarts, attempts.resume_from, loader.loaded) == (2, newest, [fresh])
    # both restarts used: the third death ends the run
    assert main_ppo._restart_after_death(DIED, config, loader, fresh, attempts) == main_ppo.EXIT_WORKER_DIED


def test_placement_failure_is_a_config_error_at_start_up_and_a_death_on_a_rebuild():
    from verl.single_controller import PlacementError

    err = PlacementError("needs 2 node(s)")
    assert main_ppo._placement_failed(err, main_ppo._Attempts(None, None, restarts=0)) == main_ppo.EXIT_BAD_CONFIG
    assert main_ppo._placement_failed(err, main_ppo._Attempts(None, None, restarts=1)) == main_ppo.EXIT_WORKER_DIED
