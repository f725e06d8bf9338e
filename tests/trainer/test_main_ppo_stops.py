"""How main_ppo ends a run that is stopped from outside or cannot save: its exit code and its one message.

``_train`` runs in this process with Ray's start and the attempts replaced: each case makes the attempt raise what
the trainer or a worker group raises (a stop signal answered, a second signal, a failed write, a damaged shard found
by a worker, a rank hung in a collective) and checks the code, the message, and, for a hang, the restart.
"""

import logging
import signal
from types import SimpleNamespace

import pytest

from tests.trainer.test_main_ppo import write_checkpoint
from verl.single_controller import CollectiveTimeoutError
from verl.trainer import main_ppo
from verl.trainer.preemption import Preempted, StopAtOnce, StopSignals
from verl.utils.checkpoint import CheckpointError, CheckpointWriteError
from verl.workers.config import PPOConfig, build_run_plan, compose_omegaconf


def typed(tmp_path, *overrides: str) -> PPOConfig:
    return PPOConfig.from_omegaconf(compose_omegaconf([f"trainer.default_local_dir={tmp_path / 'out'}", *overrides]))


class _Loader:
    def state_dict(self):
        return {"position": 0}

    def load_state_dict(self, state):
        pass


def train(monkeypatch, config, outcomes, caplog):
    """``_train`` with each attempt raising the next of ``outcomes`` (None: the attempt finishes; a function: called
    with the attempts record, raises what it returns); returns (exit code, the attempts record, the lines logged,
    what each attempt found installed for SIGTERM)."""
    seen_handlers = []

    def attempt(typed_config, data, plan, tracker, attempts):
        seen_handlers.append(signal.getsignal(signal.SIGTERM))
        outcome = outcomes.pop(0)
        if callable(outcome):
            outcome = outcome(attempts)
        if outcome is not None:
            raise outcome

    def ray_like_start(config):  # ray.init replaces the driver's SIGTERM handler with its own
        signal.signal(signal.SIGTERM, lambda signum, frame: None)

    monkeypatch.setattr(main_ppo, "start_ray", ray_like_start)
    monkeypatch.setattr(main_ppo, "_attempt", attempt)
    attempts = main_ppo._Attempts(resume_from=None, last_good=None, stop_signals=StopSignals())
    data = SimpleNamespace(train_loader=_Loader())
    previous = signal.getsignal(signal.SIGTERM)
    # only what _train logs: composing the config beforehand logs at INFO (the embedded layer), which caplog keeps
    # whenever an earlier test in this process lowered the root logger's level
    caplog.clear()
    try:
        with caplog.at_level(logging.WARNING, logger="verl.trainer"):
            code = main_ppo._train(config, data, build_run_plan(config), tracker=None, attempts=attempts)
    finally:
        attempts.stop_signals.restore()
        signal.signal(signal.SIGTERM, previous)
    lines = "\n".join(r.getMessage() for r in caplog.records)
    return code, attempts, lines, seen_handlers


def test_exit_codes_are_distinct():
    codes = [
        main_ppo.EXIT_OK,
        main_ppo.EXIT_POLICY_STOP,
        main_ppo.EXIT_BAD_CONFIG,
        main_ppo.EXIT_BAD_CHECKPOINT,
        main_ppo.EXIT_WORKER_DIED,
        main_ppo.EXIT_PREEMPTED,
        main_ppo.EXIT_STOPPED_AT_ONCE,
        main_ppo.EXIT_CHECKPOINT_WRITE_FAILED,
        main_ppo.EXIT_UNEXPECTED_ERROR,
    ]
    assert codes == [0, 1, 2, 3, 4, 5, 6, 7, 8]


def test_an_unexpected_error_exits_8_with_its_traceback_not_the_policys_1(tmp_path, monkeypatch, caplog):
    def crash(config):
        raise ZeroDivisionError("a bug in a reward function")

    monkeypatch.setattr(main_ppo, "run", crash)
    monkeypatch.setattr(main_ppo, "setup_logging", lambda: None)
    with caplog.at_level(logging.ERROR, logger="verl.trainer"), pytest.raises(SystemExit) as info:
        main_ppo.cli([f"trainer.default_local_dir={tmp_path}"])
    assert info.value.code == main_ppo.EXIT_UNEXPECTED_ERROR
    record = caplog.records[-1]
    assert record.getMessage() == "Stopped by an unexpected error (exit code 8): a bug in a reward function"
    assert record.exc_info[0] is ZeroDivisionError  # the traceback goes with it


def test_a_stop_signal_answered_exits_5_naming_the_checkpoint_and_the_handlers_outlive_ray_init(
    tmp_path, monkeypatch, caplog
):
    saved = tmp_path / "out" / "global_step_4"
    code, attempts, lines, seen = train(monkeypatch, typed(tmp_path), [Preempted("SIGTERM", 4, saved)], caplog)
    assert code == main_ppo.EXIT_PREEMPTED
    assert f"Stopped on SIGTERM after step 4, the workers shut down: checkpoint {saved}; run the same command" in lines
    assert "to resume from it (trainer.resume_mode=auto)." in lines
    # installed after Ray's start: the attempt saw ours, not the handler Ray put in
    assert seen == [attempts.stop_signals._handle]


def test_a_second_signal_exits_6_naming_the_last_complete_checkpoint(tmp_path, monkeypatch, caplog):
    latest = write_checkpoint(tmp_path / "out", 3)

    def second_signal(attempts):
        attempts.stop_signals.requested, attempts.stop_signals.stopped_at_once = "SIGINT", "SIGINT"
        return KeyboardInterrupt()  # what ray.get turns the handler's StopAtOnce into

    code, _, lines, _ = train(monkeypatch, typed(tmp_path), [second_signal], caplog)
    assert code == main_ppo.EXIT_STOPPED_AT_ONCE
    assert f"Stopped at once on a second SIGINT, without saving. Last complete checkpoint: {latest}; run the" in lines


def test_a_second_signal_while_a_restart_is_prepared_exits_6(tmp_path, monkeypatch, caplog):
    latest = write_checkpoint(tmp_path / "out", 3)
    seen = {}

    def hang(attempts):
        seen["signals"] = attempts.stop_signals
        return _hang()

    def second_signal_meanwhile(config, last_good):  # the restart rule chooses where to resume: a second Ctrl-C
        seen["signals"].requested, seen["signals"].stopped_at_once = "SIGINT", "SIGINT"
        raise StopAtOnce()

    monkeypatch.setattr(main_ppo, "checkpoint_after_death", second_signal_meanwhile)
    try:
        code, attempts, lines, _ = train(monkeypatch, typed(tmp_path, "trainer.max_restarts=1"), [hang], caplog)
    except KeyboardInterrupt:
        pytest.fail("the second signal escaped the restart rule as a KeyboardInterrupt (exit 130, no message)")
    assert (code, attempts.restarts) == (main_ppo.EXIT_STOPPED_AT_ONCE, 1)
    assert f"Stopped at once on a second SIGINT, without saving. Last complete checkpoint: {latest}; run the" in lines


def test_a_second_signal_during_the_teardown_keeps_the_code_and_the_handlers_are_put_back(
    tmp_path, monkeypatch, caplog
):
    config = typed(tmp_path)
    handlers_in_teardown = []

    def preempted(typed_config, data, plan, tracker, attempts):
        attempts.stop_signals.install()
        attempts.stop_signals.requested = "SIGTERM"
        return main_ppo.EXIT_PREEMPTED  # step saved, workers stopped

    def teardown(typed_config, tracker, trainer):  # closing the tracker, drawing the plot: a second signal
        handlers_in_teardown.append(signal.getsignal(signal.SIGINT))
        raise StopAtOnce()

    monkeypatch.setattr(main_ppo, "prepare", lambda c: (config, None, build_run_plan(config), None))
    monkeypatch.setattr("verl.utils.tracking.Tracking", lambda *args, **kwargs: None)
    monkeypatch.setattr(main_ppo, "_train", preempted)
    monkeypatch.setattr(main_ppo, "_teardown", teardown)
    before = signal.getsignal(signal.SIGINT)
    try:
        with caplog.at_level(logging.WARNING, logger="verl.trainer"):
            code = main_ppo.run(config)
    except KeyboardInterrupt:
        pytest.fail("the second signal escaped the teardown as a KeyboardInterrupt (exit 130 instead of 5)")
    # the checkpoint was saved: the code stays 5; the teardown ran under the stop handlers, put back after it
    assert code == main_ppo.EXIT_PREEMPTED
    assert handlers_in_teardown[0] is not before and signal.getsignal(signal.SIGINT) is before
    assert "A second stop signal cut the teardown short" in caplog.text


def test_under_another_resume_mode_the_message_names_the_checkpoint_to_resume_from(tmp_path, monkeypatch, caplog):
    # auto would take the newest complete checkpoint in the directory, which may be another run's later one
    saved = tmp_path / "out" / "global_step_4"
    config = typed(tmp_path, "trainer.resume_mode=disable")
    code, _, lines, _ = train(monkeypatch, config, [Preempted("SIGTERM", 4, saved)], caplog)
    assert code == main_ppo.EXIT_PREEMPTED
    assert f"resume from it with trainer.resume_mode=resume_path trainer.resume_from_path={saved}." in lines


def test_a_keyboard_interrupt_that_is_not_a_second_signal_propagates(tmp_path, monkeypatch, caplog):
    with pytest.raises(KeyboardInterrupt):
        train(monkeypatch, typed(tmp_path), [KeyboardInterrupt()], caplog)


def test_a_failed_write_exits_7_naming_the_file_the_os_error_and_the_checkpoint_that_stays(
    tmp_path, monkeypatch, caplog
):
    latest = write_checkpoint(tmp_path / "out", 3)
    failed = tmp_path / "out" / "global_step_6"
    err = CheckpointWriteError(tmp_path / "out" / ".tmp" / "actor" / "model.safetensors", "[Errno 28] No space", 28)
    err = CheckpointWriteError.while_saving(err, failed)
    code, _, lines, _ = train(monkeypatch, typed(tmp_path), [err], caplog)
    assert code == main_ppo.EXIT_CHECKPOINT_WRITE_FAILED
    assert lines.count("\n") == 0  # one message
    assert f"Saving checkpoint {failed} failed: cannot write {err.path}: [Errno 28] No space." in lines
    assert f"the last complete checkpoint is {latest} (intact; run the same command to resume from it" in lines
    assert f"Free space in {tmp_path / 'out'}, or make it writable (trainer.default_local_dir)" in lines


def test_a_damaged_shard_found_by_a_worker_exits_3_naming_it(tmp_path, monkeypatch, caplog):
    shard = tmp_path / "out" / "global_step_3" / "actor" / "sharded" / "__1_0.distcp"
    code, _, lines, _ = train(monkeypatch, typed(tmp_path), [CheckpointError(shard, "could not be read")], caplog)
    assert code == main_ppo.EXIT_BAD_CHECKPOINT
    assert f"Cannot resume: Checkpoint file {shard} could not be read." in lines


def _hang():
    return CollectiveTimeoutError(
        "actor_rollout_ref", 1, "node-b", "10.0.0.2", "rank(s) 0 waited for it in a collective of update_actor"
    )


def test_a_rank_hung_in_a_collective_is_restarted_under_max_restarts(tmp_path, monkeypatch, caplog):
    write_checkpoint(tmp_path / "out", 3)
    code, attempts, lines, _ = train(monkeypatch, typed(tmp_path, "trainer.max_restarts=1"), [_hang(), None], caplog)
    # the first attempt hung, the second finished: one restart, resumed from the newest complete checkpoint
    assert (code, attempts.restarts, attempts.resume_from) == (main_ppo.EXIT_OK, 1, tmp_path / "out" / "global_step_3")
    assert "hung in a collective" in lines and "Restart 1 of trainer.max_restarts=1" in lines


def test_a_rank_hung_in_a_collective_without_restarts_exits_4_naming_rank_and_node(tmp_path, monkeypatch, caplog):
    code, _, lines, _ = train(monkeypatch, typed(tmp_path), [_hang()], caplog)
    assert code == main_ppo.EXIT_WORKER_DIED
    assert "A worker hung in a collective: role actor_rollout_ref, rank 1, node node-b (10.0.0.2)." in lines
    assert "needs a longer trainer.collective_timeout_s" in lines


def test_no_restart_once_a_stop_was_asked(tmp_path, monkeypatch, caplog):
    def hang_after_a_signal(attempts):
        attempts.stop_signals.requested = "SIGTERM"
        return _hang()

    code, attempts, _, _ = train(monkeypatch, typed(tmp_path, "trainer.max_restarts=3"), [hang_after_a_signal], caplog)
    # restarts are left, but the run was asked to stop: it reports the hang instead of rebuilding
    assert (code, attempts.restarts) == (main_ppo.EXIT_WORKER_DIED, 0)


def test_a_handlers_message_without_a_full_stop_is_not_glued_to_the_trainers(tmp_path, monkeypatch, caplog):
    from verl.workers.update_outcome import UpdateFailedError

    code, _, lines, _ = train(monkeypatch, typed(tmp_path), [UpdateFailedError("my handler gave up")], caplog)
    assert code == main_ppo.EXIT_POLICY_STOP
    assert "Training stopped by the update-failure policy: my handler gave up. Last good checkpoint: none" in lines


@pytest.mark.parametrize("steps, said", [(1, "after 1 step:"), (2, "after 2 steps:")])
def test_the_finished_line_counts_steps_in_words(tmp_path, monkeypatch, caplog, steps, said):
    import verl.trainer.ppo.ray_trainer as ray_trainer

    class Trainer:  # a trainer that makes `steps` steps
        def __init__(self, config, groups, data, tracker, run):
            self.global_step = 0

        def fit(self):
            self.global_step = steps

        def final_summary(self):
            return "critic/score/mean=0.5"

    monkeypatch.setattr(main_ppo, "build_worker_groups", lambda config, plan: ())
    monkeypatch.setattr(ray_trainer, "RayPPOTrainer", Trainer)
    config = typed(tmp_path)
    attempts = main_ppo._Attempts(resume_from=None, last_good=None)
    with caplog.at_level(logging.INFO, logger="verl.trainer"):
        main_ppo._attempt(config, None, build_run_plan(config), None, attempts)
    assert f"training finished {said} critic/score/mean=0.5" in [r.getMessage() for r in caplog.records]
