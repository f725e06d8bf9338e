"""A leftover checkpoint never takes a later run over silently: the resume is said, each changed setting warned
about, and a run that cannot continue the checkpoint (nothing left to train, another model or algorithm) refused
with exit code 2 before anything is trained, ``metrics.jsonl`` cut or the plot redrawn.

The fast cases resume from a stand-in checkpoint (complete files, tiny contents) holding a saved ``config.json``;
the slow one from the checkpoint of a real one-step run.
"""

import logging

import pytest

from tests.trainer.test_main_ppo import write_checkpoint
from verl.trainer import main_ppo
from verl.trainer.ppo.trainer_checkpoints import CONFIG_FILE, write_saved_config
from verl.trainer.resume_check import check_resume, config_differences
from verl.workers.config import PPOConfig, compose_omegaconf

LR = "actor_rollout_ref.actor.optim.lr"


def typed(tmp_path, *overrides: str) -> PPOConfig:
    return PPOConfig.from_omegaconf(compose_omegaconf([f"trainer.default_local_dir={tmp_path / 'out'}", *overrides]))


def run_and_capture(caplog, overrides, tmp_path):
    """``run`` in this process: (exit code, the error lines); warnings stay in ``caplog``."""
    import ray

    config = compose_omegaconf([f"trainer.default_local_dir={tmp_path / 'out'}", *overrides])
    with caplog.at_level(logging.INFO, logger="verl.trainer"):
        code = main_ppo.run(config)
    assert not ray.is_initialized(), "a refused resume must not start Ray"
    return code, "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)


def saved_run(tmp_path, step: int, *overrides: str):
    """A stand-in ``global_step_<step>`` whose run had ``overrides``, beside that run's metrics and plot."""
    checkpoint = write_checkpoint(tmp_path / "out", step)
    write_saved_config(checkpoint, typed(tmp_path, *overrides))
    metrics = tmp_path / "out" / "metrics.jsonl"
    metrics.write_text("".join(f'{{"step": {n}, "critic/score/mean": 0.5}}\n' for n in range(step + 3)))
    (tmp_path / "out" / "training_curves.png").write_bytes(b"the finished run's plot")
    return checkpoint


def untouched(tmp_path, step: int) -> bool:
    out = tmp_path / "out"
    rows = (out / "metrics.jsonl").read_text().splitlines()
    return len(rows) == step + 3 and (out / "training_curves.png").read_bytes() == b"the finished run's plot"


def test_a_shorter_run_than_the_checkpoint_is_refused_with_exit_2_and_touches_nothing(tmp_path, caplog):
    # the case: global_step_35 left by a Ctrl-C'd run, then a 5-step run in the same directory
    checkpoint = saved_run(tmp_path, 35)
    code, message = run_and_capture(caplog, ["trainer.total_training_steps=5", f"{LR}=1e-3"], tmp_path)
    assert code == main_ppo.EXIT_BAD_CONFIG
    assert f"trainer.resume_mode=auto found {checkpoint}" in message, message
    assert "nothing is left to train: it was saved after step 35, and this run trains to step 5" in message
    assert "trainer.resume_mode=disable" in message and "trainer.total_training_steps above 35" in message
    # the default directory is not <...>/<experiment_name>: the other directory is the key to change
    assert "another trainer.default_local_dir" in message
    assert untouched(tmp_path, 35)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"resuming with a changed setting: {LR}=0.001 (was 0.002 in {checkpoint})" in warnings, warnings


def test_the_checkpoint_of_a_finished_run_is_not_resumed_by_the_same_command(tmp_path, caplog):
    saved_run(tmp_path, 4, "trainer.total_training_steps=4")
    code, message = run_and_capture(caplog, ["trainer.total_training_steps=4"], tmp_path)
    assert code == main_ppo.EXIT_BAD_CONFIG and "nothing is left to train" in message
    assert untouched(tmp_path, 4)


@pytest.mark.parametrize(
    "changed, key",
    [
        ("algorithm.adv_estimator=rloo", "algorithm.adv_estimator: 'grpo' -> 'rloo'"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "policy_loss.loss_mode: 'vanilla' -> 'gspo'"),
        (
            "+actor_rollout_ref.model.override_config.num_hidden_layers=1",
            "actor_rollout_ref.model.override_config.num_hidden_layers: '(absent)' -> 1",
        ),
    ],
    ids=["estimator", "policy-loss", "model-layers"],
)
def test_another_model_or_algorithm_is_refused_naming_the_key(tmp_path, caplog, changed, key):
    saved_run(tmp_path, 3)
    code, message = run_and_capture(caplog, ["trainer.total_training_steps=10", changed], tmp_path)
    assert code == main_ppo.EXIT_BAD_CONFIG
    assert key in message and "differs from the checkpoint's" in message, message
    assert "nothing is left to train" not in message  # 3 < 10: that is not the reason
    assert untouched(tmp_path, 3)


def test_a_changed_learning_rate_is_a_warning_and_the_resume_goes_on(tmp_path, caplog):
    checkpoint = saved_run(tmp_path, 3, "trainer.total_training_steps=10")
    config = typed(tmp_path, "trainer.total_training_steps=20", f"{LR}=1e-4")
    with caplog.at_level(logging.INFO, logger="verl.trainer"):
        check_resume(config, 20, checkpoint)  # no refusal
    lines = [r.getMessage() for r in caplog.records]
    assert (
        f"resuming from {checkpoint} (trainer.resume_mode=auto: the newest checkpoint), saved after step 3; "
        "this run trains to step 20" in lines
    )
    changed = sorted(line for line in lines if line.startswith("resuming with a changed setting"))
    # exactly the two keys the command changed (the directory and the rest are the same)
    assert changed == [
        f"resuming with a changed setting: {LR}=0.0001 (was 0.002 in {checkpoint})",
        f"resuming with a changed setting: trainer.total_training_steps=20 (was 10 in {checkpoint})",
    ]


def test_a_checkpoint_without_a_saved_config_is_still_checked_for_its_step(tmp_path, caplog):
    checkpoint = write_checkpoint(tmp_path / "out", 6)  # written before checkpoints held config.json
    config = typed(
        tmp_path,
        "trainer.total_training_steps=6",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={checkpoint}",
    )
    with caplog.at_level(logging.WARNING, logger="verl.trainer"), pytest.raises(ValueError) as refused:
        check_resume(config, 6, checkpoint)
    assert str(refused.value).startswith(f"trainer.resume_from_path={checkpoint}, but this run cannot continue it")
    assert any(CONFIG_FILE in r.getMessage() and "cannot be compared" in r.getMessage() for r in caplog.records)


def test_config_differences_lists_leaf_keys_and_ignores_how_the_checkpoint_was_found():
    saved = {"a": {"b": [1, 2], "c": 1.0}, "trainer": {"resume_mode": "auto"}, "gone": {}}
    current = {"a": {"b": (1, 2), "c": 2.0, "d": "new"}, "trainer": {"resume_mode": "resume_path"}}
    # a tuple is the list JSON saved; resume_mode is how the checkpoint was found, not what is trained
    assert config_differences(saved, current) == [
        ("a.c", 1.0, 2.0),
        ("a.d", "(absent)", "new"),
        ("gone", {}, "(absent)"),
    ]


@pytest.mark.slow
def test_a_finished_runs_checkpoint_refuses_a_shorter_run_end_to_end(tmp_path, capfd):
    """The issue's case with a real checkpoint: a 1-step run saves global_step_1 and its plot; the same directory
    with a 1-step total and another learning rate is refused on the command line (exit 2), and the run's metrics,
    plot and checkpoint stay as they were."""
    import json

    import ray

    out = tmp_path / "out"
    first = [
        f"trainer.default_local_dir={out}",
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[jsonl]",
        "trainer.progress_bar=false",
        "actor_rollout_ref.actor.dtype=float32",
    ]
    try:
        with pytest.raises(SystemExit) as finished:
            main_ppo.cli(first)
    finally:
        ray.shutdown()
    assert finished.value.code == main_ppo.EXIT_OK
    checkpoint = out / "global_step_1"
    saved = json.loads((checkpoint / CONFIG_FILE).read_text())
    assert saved["trainer"]["total_training_steps"] == 1 and saved["actor_rollout_ref"]["actor"]["dtype"] == "float32"
    before = {name: (out / name).read_bytes() for name in ("metrics.jsonl", "training_curves.png")}
    capfd.readouterr()
    with pytest.raises(SystemExit) as refused:
        main_ppo.cli([*first, f"{LR}=1e-4"])
    assert refused.value.code == main_ppo.EXIT_BAD_CONFIG
    logged = capfd.readouterr().err
    assert f"resuming from {checkpoint} (trainer.resume_mode=auto: the newest checkpoint), saved after step 1" in logged
    assert f"resuming with a changed setting: {LR}=0.0001 (was 0.002 in {checkpoint})" in logged
    assert "nothing is left to train: it was saved after step 1, and this run trains to step 1" in logged
    assert not ray.is_initialized()
    assert {name: (out / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in out.glob("global_step_*")) == ["global_step_1"]
