"""main_ppo's start-up with the device rule and verl's out-of-scope features: the one line that says where the run
trains, ``trainer.device=cuda`` without a GPU as a bad config (exit 2) before any worker starts, and verl's
out-of-scope keys refused by name on the command line, never as "Could not override"."""

import logging

import pytest
import torch

from verl.trainer import main_ppo, ray_setup
from verl.trainer.main_ppo import CONFIG_DIR, EXIT_BAD_CONFIG, EXIT_OK, parse_command_line
from verl.workers.config import compose_omegaconf


def run_without_workers(monkeypatch, caplog, tmp_path, gpus, *overrides):
    """main_ppo.run with Ray's start replaced and a cluster of ``gpus`` GPUs; no worker group may start, and the
    attempts finish at once. Returns (exit code, the lines logged)."""

    def no_workers(*args, **kwargs):
        raise AssertionError("a worker group started")

    monkeypatch.setattr(main_ppo, "start_ray", lambda config: None)
    monkeypatch.setattr(ray_setup, "cluster_gpus", lambda: gpus)
    monkeypatch.setattr(main_ppo, "build_worker_groups", no_workers)
    monkeypatch.setattr(main_ppo, "_attempt_until_done", lambda *args: EXIT_OK)
    config = compose_omegaconf([f"trainer.default_local_dir={tmp_path / 'out'}", *overrides])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="verl.trainer"):
        code = main_ppo.run(config)
    return code, [r.getMessage() for r in caplog.records]


def test_auto_on_a_cluster_without_gpus_logs_one_line_and_trains_on_cpu(monkeypatch, caplog, tmp_path):
    code, lines = run_without_workers(monkeypatch, caplog, tmp_path, 0, "trainer.device=auto")
    assert code == EXIT_OK
    # the embedded run: 1 node x 1 rank
    assert [line for line in lines if line.startswith("training on")] == [
        "training on 1 CPU process: no GPU in the cluster"
    ]
    assert any("  device: cpu" in line.splitlines() for line in lines)  # the plan logged (and saved) says cpu


def test_cuda_without_a_gpu_exits_2_before_any_worker_starts(monkeypatch, caplog, tmp_path):
    code, lines = run_without_workers(monkeypatch, caplog, tmp_path, 0, "trainer.device=cuda")
    assert code == EXIT_BAD_CONFIG
    (error,) = [line for line in lines if line.startswith("Bad config")]
    assert "trainer.device=cuda, but the Ray cluster has no GPU" in error and "trainer.device=auto" in error


def test_auto_on_too_few_gpus_exits_2_naming_the_sizes(monkeypatch, caplog, tmp_path):
    code, lines = run_without_workers(
        monkeypatch, caplog, tmp_path, 1, "trainer.device=auto", "trainer.n_gpus_per_node=2"
    )
    assert code == EXIT_BAD_CONFIG
    assert any("places 2 rank(s)" in line and "has 1 GPU(s)" in line for line in lines)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: cuda is a good value here")
def test_cuda_on_this_machine_without_a_gpu_exits_2_after_ray_starts_and_before_training(caplog, tmp_path):
    import ray

    config = compose_omegaconf([f"trainer.default_local_dir={tmp_path / 'out'}", "trainer.device=cuda"])
    try:
        with caplog.at_level(logging.ERROR, logger="verl.trainer"):
            code = main_ppo.run(config)
    finally:
        ray.shutdown()
    assert code == EXIT_BAD_CONFIG
    assert "trainer.device=cuda, but the Ray cluster has no GPU" in caplog.text
    assert not list((tmp_path / "out").glob("global_step_*"))  # nothing trained: no checkpoint


@pytest.mark.parametrize(
    "override, named",
    [
        ("transfer_queue.backend.storage_backend=MooncakeStore", "transfer_queue.backend.storage_backend asks for Tr"),
        ("+distillation.teacher_models.teacher_model.key=x", "asks for the distillation trainers"),
        ("transfer_queue.enable=true", "transfer_queue.enable=true asks for TransferQueue"),
        ("distillation.enabled=true", "distillation.enabled=true asks for the distillation trainers"),
        ("actor_rollout_ref.actor.veomni.param_offload=True", "asks for the VeOmni training engine"),
        ("actor_rollout_ref.actor.engine.tp=1", "asks for Megatron Lite"),
        ("actor@actor_rollout_ref.actor=mlite_actor", "asks for Megatron Lite"),
        ("actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.ulysses_parallel_size=1", "FSDP Turbo"),
        ("trainer.device=npu", "asks for Ascend NPUs"),
        ("model_engine=veomni", "model_engine=veomni asks for the VeOmni training engine"),
        ("critic@critic=torchtitan_critic", "asks for the TorchTitan training engine"),
    ],
)
def test_out_of_scope_features_are_refused_by_name_at_start_up(override, named):
    with pytest.raises(ValueError, match="out of scope here") as info:
        parse_command_line([override], CONFIG_DIR, "ppo_trainer").validate()
    assert named in str(info.value) and "Could not override" not in str(info.value)


@pytest.mark.parametrize("override", ["transfer_queue.enable=false", "distillation.enabled=false"])
def test_the_off_switches_of_verls_scripts_start(override):
    assert parse_command_line([override], CONFIG_DIR, "ppo_trainer").validate() is not None


def test_a_script_using_several_out_of_scope_features_hears_all_of_them_before_any_unknown_key():
    overrides = [
        "actor_rollout_ref.rollout.name=trtllm",
        "actor_rollout_ref.no_such_key=1",  # Hydra would stop here first without the scan
        "model_engine=veomni",
    ]
    with pytest.raises(ValueError) as info:
        parse_command_line(overrides, CONFIG_DIR, "ppo_trainer")
    message = str(info.value)
    assert message.startswith("2 settings ask for features out of scope here:")
    assert "rollout.name=trtllm: TensorRT-LLM" in message and "model_engine=veomni asks for" in message
    assert "no_such_key" not in message


@pytest.mark.parametrize(
    "override, suggested",
    [
        # a typo in the section: the section's nearest key by its last part
        ("actor_rollout_ref.actor.optim.lrr=1e-6", "Did you mean actor_rollout_ref.actor.optim.lr?"),
        # a key put in the wrong section: the keys of that name elsewhere
        ("actor_rollout_ref.actor.lr=1e-6", "Did you mean actor_rollout_ref.actor.optim.lr or critic.optim.lr?"),
    ],
)
def test_an_unknown_key_gets_the_nearest_known_keys_and_not_hydras_plus_advice(override, suggested):
    with pytest.raises(ValueError) as info:
        parse_command_line([override], CONFIG_DIR, "ppo_trainer")
    message = str(info.value)
    assert suggested in message
    assert "To append to your config use" not in message and "is not a key of this config" in message


def test_an_unknown_key_added_with_plus_gets_the_nearest_known_key_too():
    with pytest.raises(ValueError, match=r"optim.lrr is not a known config key. Did you mean actor_rollout_ref.act"):
        parse_command_line(["+actor_rollout_ref.actor.optim.lrr=1e-6"], CONFIG_DIR, "ppo_trainer").validate()
