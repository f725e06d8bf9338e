"""main_ppo's start-up: every bad value, path and checkpoint is refused before Ray starts, with its exit code.

These call :func:`verl.trainer.main_ppo.run` in this process on a composed config. A refusal returns before
``ray.init``, so ``ray.is_initialized()`` stays False: that is the "Ray never started" of each case.
"""

import logging
import pickle

import pytest
import torch

import verl.trainer.main_ppo as main_ppo
from verl.trainer.main_ppo import EXIT_BAD_CHECKPOINT, EXIT_BAD_CONFIG, choose_checkpoint, run
from verl.utils.checkpoint import save_state, save_weights
from verl.workers.config import PPOConfig, compose_omegaconf

A = "actor_rollout_ref.actor"
# Each: (override, the full key the message must name). Every one of these used to pass start-up and fail in a
# Ray worker 17-40 s later, with exit code 1 and a traceback.
BAD_VALUES = [
    (f"{A}.optim.initial_loss_scale=0", f"{A}.optim.initial_loss_scale"),
    (f"{A}.optim.initial_loss_scale=-1", f"{A}.optim.initial_loss_scale"),
    (f"{A}.optim.min_loss_scale=1e12", f"{A}.optim.min_loss_scale"),  # above the initial 2**32
    (f"{A}.optim.hysteresis=0", f"{A}.optim.hysteresis"),
    (f"{A}.optim.loss_scale_window=0", f"{A}.optim.loss_scale_window"),
    (f"{A}.optim.lr=0", f"{A}.optim.lr"),
    (f"{A}.optim.lr_scheduler=bogus", f"{A}.optim.lr_scheduler"),
    ("actor_rollout_ref.rollout.temperature=-1", "actor_rollout_ref.rollout.temperature"),
    ("actor_rollout_ref.rollout.top_p=1.5", "actor_rollout_ref.rollout.top_p"),
    (f"{A}.policy_loss=bogus", f"{A}.policy_loss"),
    (f"{A}.loss_agg_mode=bogus", f"{A}.loss_agg_mode"),
    (f"{A}.fault_injection.nonfinite_grad_steps=[0]", f"{A}.fault_injection.nonfinite_grad_steps"),
    (f"{A}.fault_injection.nonfinite_grad_steps=[-1]", f"{A}.fault_injection.nonfinite_grad_steps"),
    (f"{A}.fault_injection.ranks=[-1]", f"{A}.fault_injection.ranks"),
    ("critic.optim.hysteresis=0", "critic.optim.hysteresis"),  # the critic's keys name the critic
    ("critic.optim.initial_loss_scale=0", "critic.optim.initial_loss_scale"),
    ("critic.optim.lr=0", "critic.optim.lr"),
    ("critic.loss_agg_mode=bogus", "critic.loss_agg_mode"),
    ("critic.fault_injection.nonfinite_grad_steps=[0]", "critic.fault_injection.nonfinite_grad_steps"),
    # accepted silently before
    (f"{A}.ppo_epochs=0", f"{A}.ppo_epochs"),
    ("+trainer.totl_training_steps=5", "trainer.totl_training_steps"),
    ("+foo.bar=1", "foo"),
    (f"{A}.fault_injection.ranks=[5]", f"{A}.fault_injection.ranks"),  # one worker: rank 5 never exists
    # (an attribute the model's config lacks is set with a warning, as verl does: tests/models/test_loading.py)
    ("actor_rollout_ref.model.override_config=3", "actor_rollout_ref.model.override_config"),
]


def run_and_capture(caplog, overrides, tmp_path):
    import ray

    config = compose_omegaconf([f"trainer.default_local_dir={tmp_path / 'out'}", *overrides])
    with caplog.at_level(logging.ERROR, logger="verl.trainer"):
        code = run(config)
    assert not ray.is_initialized(), "a refused config must not start Ray"
    return code, "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)


@pytest.mark.parametrize("override, key", BAD_VALUES, ids=[o for o, _ in BAD_VALUES])
def test_bad_value_exits_2_before_ray_and_names_the_full_key(caplog, tmp_path, override, key):
    code, message = run_and_capture(caplog, [override], tmp_path)
    assert code == EXIT_BAD_CONFIG
    assert key in message and message.startswith("Bad config:"), message


def test_a_missing_model_directory_is_one_clean_message(caplog, tmp_path):
    # the embedded run's sizes on another model path (verl's defaults would first ask for the micro-batch sizes)
    overrides = ["actor_rollout_ref.model.path=/no/such/model", "embedded@_global_=tiny_grpo_fp16"]
    code, message = run_and_capture(caplog, overrides, tmp_path)
    assert code == EXIT_BAD_CONFIG
    assert message.startswith("Bad config: actor_rollout_ref.model.path='/no/such/model' does not exist"), message
    assert "Traceback" not in message


def test_custom_score_fn_error_names_its_key(caplog, tmp_path):
    code, message = run_and_capture(caplog, ["reward_model.custom_score_fn=no_such_module:score"], tmp_path)
    assert code == EXIT_BAD_CONFIG and "reward_model.custom_score_fn" in message


def test_a_class_path_policy_names_the_setting_the_user_wrote(caplog, tmp_path):
    code, message = run_and_capture(caplog, [f"{A}.update_failure_policy=no_such_pkg.mod:Handler"], tmp_path)
    assert code == EXIT_BAD_CONFIG
    assert f"{A}.update_failure_policy='no_such_pkg.mod:Handler'" in message
    assert ".module" not in message  # the user set no module key


# ---------------------------------------------------------------------------------------------- checkpoints


def write_checkpoint(root, step, *, actor=True):
    """A complete (as far as files go) global_step_N with tiny stand-in contents."""
    step_dir = root / f"global_step_{step}"
    (step_dir / "actor").mkdir(parents=True)
    save_state(step_dir / "trainer_state.pt", {"global_step": step, "data_loader": {"epoch": 0, "position": 0}})
    if actor:
        save_weights(step_dir / "actor" / "model.safetensors", {"w": torch.arange(64, dtype=torch.float32)})
        save_state(step_dir / "actor" / "train_state.pt", {"num_update_steps": step})
    return step_dir


class Foreign:
    """Not one of ours: its pickle names this class, which weights-only loading refuses."""


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def truncated_fsdp2_shard(step_dir):
    """The actor's sharded (DCP) files, as the fsdp2 backend writes them, with the shard file cut in half."""
    import warnings

    from verl.utils.fsdp_checkpoint import save_sharded

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP without a process group says so
        save_sharded(step_dir / "actor" / "sharded", torch.nn.Linear(4, 3), None, None)
    truncate(step_dir / "actor" / "sharded" / "__0_0.distcp")


@pytest.mark.parametrize(
    "damage, file",
    [
        (lambda d: truncate(d / "actor" / "model.safetensors"), "actor/model.safetensors"),
        (lambda d: truncate(d / "actor" / "train_state.pt"), "actor/train_state.pt"),
        (lambda d: torch.save({"x": Foreign()}, d / "actor" / "train_state.pt"), "actor/train_state.pt"),
        (lambda d: (d / "trainer_state.pt").write_bytes(pickle.dumps(Foreign())), "trainer_state.pt"),
        (truncated_fsdp2_shard, "actor/sharded/__0_0.distcp"),
    ],
    ids=["truncated-weights", "truncated-train-state", "foreign-train-state", "foreign-trainer-state", "fsdp2-shard"],
)
def test_damaged_checkpoint_exits_3_naming_the_file_and_what_to_do(caplog, tmp_path, damage, file):
    damage(write_checkpoint(tmp_path / "out", 3))
    code, message = run_and_capture(caplog, [], tmp_path)
    assert code == EXIT_BAD_CHECKPOINT
    assert file in message and "resume_mode=disable" in message, message
    assert "weights_only=False" not in message  # torch's advice would run foreign code


def test_auto_resume_skips_an_incomplete_newer_checkpoint(caplog, tmp_path):
    complete = write_checkpoint(tmp_path / "out", 3)
    partial = tmp_path / "out" / "global_step_9" / "actor"
    partial.mkdir(parents=True)
    save_weights(partial / "model.safetensors", {"w": torch.zeros(2)})  # what a non-atomic copy leaves behind
    config = PPOConfig.from_omegaconf(compose_omegaconf([f"trainer.default_local_dir={tmp_path / 'out'}"]))
    with caplog.at_level(logging.WARNING):
        assert choose_checkpoint(config) == complete
    assert any("global_step_9" in r.getMessage() for r in caplog.records)


def test_resume_mode_disable_ignores_even_a_damaged_checkpoint(tmp_path):
    truncate(write_checkpoint(tmp_path / "out", 3) / "actor" / "model.safetensors")
    overrides = [f"trainer.default_local_dir={tmp_path / 'out'}", "trainer.resume_mode=disable"]
    assert choose_checkpoint(PPOConfig.from_omegaconf(compose_omegaconf(overrides))) is None


@pytest.mark.parametrize(
    "override, match",
    [
        ("critic.warmup_steps=3", r"critic\.warmup_steps is now trainer\.critic_warmup"),
        (f"{A}.log_prob_micro_batch_size_per_gpu=8", r"is now actor_rollout_ref\.rollout\.log_prob_micro_batch_size"),
    ],
)
def test_command_line_names_renamed_and_unsupported_verl_keys(override, match):
    from verl.trainer.main_ppo import CONFIG_DIR, compose_from_command_line

    with pytest.raises(ValueError, match=match):
        compose_from_command_line([override], CONFIG_DIR, "ppo_trainer")


def test_the_message_names_the_key_hydra_refused_not_another_known_one():
    # Hydra stops at the misspelt key; a renamed key later on the line must not take its place in the message
    from verl.trainer.main_ppo import CONFIG_DIR, compose_from_command_line

    with pytest.raises(ValueError) as info:
        compose_from_command_line(["trainer.totl_training_steps=5", "critic.warmup_steps=3"], CONFIG_DIR, "ppo_trainer")
    assert "trainer.totl_training_steps" in str(info.value) and "critic_warmup" not in str(info.value)


@pytest.mark.parametrize("config_path", ["config", "./config"])
@pytest.mark.parametrize("config_name", ["ppo_megatron_trainer", "ppo_megatron_trainer.yaml"])
def test_relative_config_path_resolves_against_verl_trainer_as_in_verl(tmp_path, monkeypatch, config_path, config_name):
    # verl's scripts say --config-path=config: Hydra resolves it against verl/trainer/, wherever the user stands
    from verl.trainer.main_ppo import CONFIG_DIR, parse_command_line

    monkeypatch.chdir(tmp_path)  # no ./config here: only verl/trainer/config can be meant
    argv = [f"--config-path={config_path}", f"--config-name={config_name}"]
    composed = parse_command_line(argv, CONFIG_DIR, "ppo_trainer")
    assert composed.config.actor_rollout_ref.actor.strategy == "megatron"  # ppo_megatron_trainer.yaml's own


def test_absolute_config_path_is_taken_as_given(tmp_path):
    from verl.trainer.main_ppo import CONFIG_DIR, parse_command_line

    (tmp_path / "mine.yaml").write_text(
        "defaults:\n  - ppo_trainer\n  - _self_\nhydra:\n  searchpath:\n"
        "    - pkg://verl.trainer.config\ntrainer:\n  total_epochs: 7\n"
    )
    composed = parse_command_line([f"--config-path={tmp_path}", "--config-name=mine"], CONFIG_DIR, "ppo_trainer")
    assert composed.config.trainer.total_epochs == 7


def test_a_workers_exception_is_logged_with_the_workers_traceback(capfd, monkeypatch):
    # what verl.single_controller.results re-raises in the driver: the worker's type and message, and its traceback
    # as an attribute, which the driver's own traceback does not show
    err = RuntimeError("attempting to assign a gradient")
    err.remote_traceback = 'File "verl/workers/actor/backend.py", line 99, in accumulate_micro_batches'
    err.rank = 3

    def failing_run(config):
        raise err

    monkeypatch.setattr(main_ppo, "run", failing_run)
    with pytest.raises(SystemExit) as info:
        main_ppo.cli([])
    assert info.value.code == main_ppo.EXIT_UNEXPECTED_ERROR
    logged = capfd.readouterr().err  # the command line's own log handler writes to stderr
    assert "rank 3 raised RuntimeError; its traceback:" in logged and "accumulate_micro_batches" in logged
    assert "Stopped by an unexpected error (exit code 8): attempting to assign a gradient" in logged


@pytest.mark.slow
def test_a_checkpoint_holds_the_run_plan_the_run_logged(tmp_path, caplog):
    import ray

    from verl.trainer.ppo.trainer_checkpoints import read_run_plan
    from verl.workers.config import compose_with_defaults

    out = tmp_path / "out"
    overrides = [
        f"trainer.default_local_dir={out}",
        "trainer.device=auto",  # resolved once Ray starts: this machine's GPUs, else the CPU
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[jsonl]",
        "trainer.plot=false",
        "trainer.progress_bar=false",
        "actor_rollout_ref.actor.dtype=float32",
    ]
    try:
        with caplog.at_level(logging.INFO, logger="verl.trainer"):
            assert main_ppo.run(compose_with_defaults(overrides)) == main_ppo.EXIT_OK
    finally:
        ray.shutdown()
    plan = read_run_plan(out / "global_step_1")
    # the embedded run, one step: 16 prompts, GRPO without KL (no reference, no critic), one update per step
    assert plan["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    assert (plan["train_batch_size"], plan["total_training_steps"], plan["test_freq"]) == (16, 1, -1)
    assert plan["roles"] == ["actor", "rollout"] and plan["world_size"] == 1
    assert not (plan["needs_reference"] or plan["needs_critic"] or plan["computes_old_log_prob"])
    (logged,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("run plan")]
    assert f"  device: {plan['device']}" in logged.splitlines()  # the plan logged is the plan saved
