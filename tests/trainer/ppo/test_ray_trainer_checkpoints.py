"""The trainer's saves under failure, and its answer to a stop signal, with stand-in worker groups in this process.

A save that fails (a worker's disk full, the driver's directory read-only, a rank killed mid-save) leaves the
previous checkpoint as the newest complete one and nothing under the failed step's name; a stop signal between
two steps saves the step the run stands at (once) and raises Preempted.
"""

import errno
import logging
from pathlib import Path

import pytest
import torch

import verl.trainer.ppo.trainer_checkpoints as trainer_checkpoints
from verl.single_controller import WorkerDiedError
from verl.trainer.preemption import Preempted, StopSignals
from verl.utils.checkpoint import (
    CheckpointWriteError,
    find_latest_checkpoint,
    remove_save_debris,
    save_state,
    save_weights,
)


def trainer_for(tmp_path, *overrides):
    from verl.trainer.data_setup import TrainingData
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, TrainerRun
    from verl.trainer.ray_setup import WorkerGroups
    from verl.workers.config import compose_ppo_config

    config = compose_ppo_config([f"trainer.default_local_dir={tmp_path}", "trainer.progress_bar=false", *overrides])
    data = TrainingData(train_loader=_Loader(), val_batches=[], reward_fn=None, num_train_prompts=0)
    trainer = RayPPOTrainer(config, WorkerGroups(_Group()), data, tracker=None, run=TrainerRun(total_training_steps=6))
    return trainer


class _Loader:
    def __init__(self):
        self.position = 0

    def __next__(self):
        self.position += 1
        return self.position

    def state_dict(self):
        return {"epoch": 0, "position": self.position}


class _Group:
    """A worker group's save: the files of a complete role directory, or, with ``fail``, a part of a sharded one
    and then the failure."""

    def __init__(self):
        self.fail: BaseException | None = None
        self.num_saves = 0

    def save_checkpoint(self, path):
        self.num_saves += 1
        path = Path(path)
        if self.fail is not None:
            (path / "sharded").mkdir(parents=True)
            (path / "sharded" / "__0_0.distcp").write_bytes(b"rank 0's shards, written before rank 1 failed")
            raise self.fail
        path.mkdir(parents=True)
        save_weights(path / "model.safetensors", {"w": torch.zeros(2)})
        save_state(path / "train_state.pt", {"steps": 0})


def _saved_at(trainer, *steps):
    for step in steps:
        trainer.global_step = step
        trainer.save_checkpoint()


def test_a_workers_full_disk_stops_the_save_and_keeps_the_previous_checkpoint(tmp_path):
    trainer = trainer_for(tmp_path)
    _saved_at(trainer, 3)
    full = OSError(errno.ENOSPC, "No space left on device")
    full.rank = 1  # as the worker group attaches it
    trainer.actor_wg.fail, trainer.global_step = full, 6
    with pytest.raises(CheckpointWriteError) as info:
        trainer.save_checkpoint()
    err = info.value
    assert (err.errno, err.checkpoint) == (errno.ENOSPC, tmp_path / "global_step_6")
    assert err.reason == "[Errno 28] No space left on device (on rank 1)"
    # nothing of the failed save is left, under its name or a temporary one; step 3 is still the one to resume
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3"]
    assert find_latest_checkpoint(tmp_path) == tmp_path / "global_step_3" == trainer.last_checkpoint


def test_a_read_only_directory_for_the_drivers_file_is_named(tmp_path, monkeypatch):
    trainer = trainer_for(tmp_path)
    _saved_at(trainer, 3)

    def read_only(path, state):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(trainer_checkpoints, "save_state", read_only)
    trainer.global_step = 6
    with pytest.raises(CheckpointWriteError) as info:
        trainer.save_checkpoint()
    # the driver's own file, in the temporary directory of the save, which is gone with it
    assert info.value.path.name == "trainer_state.pt" and info.value.path.parent.name.startswith(".global_step_6.tmp-")
    assert info.value.reason == "[Errno 30] Read-only file system"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3"]


def test_a_rank_killed_mid_save_leaves_the_last_complete_checkpoint_and_no_debris(tmp_path):
    trainer = trainer_for(tmp_path, "actor_rollout_ref.actor.strategy=fsdp2")
    _saved_at(trainer, 3)
    trainer.actor_wg.fail = WorkerDiedError("actor_rollout_ref", 1, "node-b", "10.0.0.2", "killed")
    trainer.global_step = 6
    with pytest.raises(WorkerDiedError):
        trainer.save_checkpoint()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3"]
    # a rank that outlived the driver's clean-up may still create the temporary directory again: start-up and
    # every restart remove it before choosing, and it is never a candidate
    late = tmp_path / ".global_step_6.tmp-abc" / "actor" / "sharded"
    late.mkdir(parents=True)
    assert find_latest_checkpoint(tmp_path) == tmp_path / "global_step_3"
    assert remove_save_debris(tmp_path) == [tmp_path / ".global_step_6.tmp-abc"]


def test_a_file_a_rank_wrote_where_the_driver_cannot_see_it_stops_the_save(tmp_path):
    # rank 0 runs on another node whose disk is not shared: its model.safetensors went there, so the driver finds
    # only train_state.pt; a checkpoint nobody could resume from must not count (nor push an older one out)
    trainer = trainer_for(tmp_path, "trainer.max_actor_ckpt_to_keep=1")
    _saved_at(trainer, 3)
    real_save = trainer.actor_wg.save_checkpoint

    def save_on_another_node(path):
        real_save(path)
        (Path(path) / "model.safetensors").unlink()

    trainer.actor_wg.save_checkpoint, trainer.global_step = save_on_another_node, 6
    with pytest.raises(CheckpointWriteError) as info:
        trainer.save_checkpoint()
    err = info.value
    assert err.checkpoint == tmp_path / "global_step_6" and err.path.parts[-2:] == ("actor", "model.safetensors")
    assert "the driver finds this file is missing" in err.reason and "(a shared filesystem)" in err.reason
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3"] and trainer.last_checkpoint.name.endswith(
        "3"
    )


def test_a_failed_clean_up_of_old_checkpoints_does_not_stop_the_run(tmp_path, monkeypatch, caplog):
    trainer = trainer_for(tmp_path, "trainer.max_actor_ckpt_to_keep=1")

    def refuse(root, newest, keep, roles):
        raise PermissionError(errno.EACCES, "Permission denied", str(root))

    monkeypatch.setattr(trainer_checkpoints, "prune_checkpoints", refuse)
    with caplog.at_level(logging.WARNING, logger="verl.trainer"):
        _saved_at(trainer, 3, 6)
    assert trainer.last_checkpoint == tmp_path / "global_step_6"  # the new checkpoint is complete and counts
    assert f"could not remove old checkpoints under {tmp_path} ([Errno 13] Permission denied)" in caplog.text


# ---------------------------------------------------------------------------------------------- stop signals


def stoppable(tmp_path, stop_during_step, *overrides):
    """A trainer whose step ``stop_during_step`` receives a stop signal (as the handler records it)."""
    trainer = trainer_for(tmp_path, *overrides)
    trainer.stop_signals = StopSignals()
    trainer.tracker = type("NoTracker", (), {"log": lambda *a, **k: None, "set_aside_earlier_rows": lambda s: None})()
    steps_run = []

    def train_step(batch):
        steps_run.append(trainer.stop_signals.step_in_progress)
        if len(steps_run) == stop_during_step:
            trainer.stop_signals.requested = "SIGTERM"
        return {}

    trainer.train_step = train_step
    return trainer, steps_run


def test_a_stop_signal_finishes_the_step_saves_it_and_raises_preempted(tmp_path):
    trainer, steps_run = stoppable(tmp_path, 2)
    with pytest.raises(Preempted) as info:
        trainer.fit()
    # steps 1 and 2 ran (the signal came during 2); step 2 saved though save_freq is off (-1); steps 3-6 never ran
    assert steps_run == [1, 2]
    assert (info.value.signal_name, info.value.step, info.value.checkpoint) == (
        "SIGTERM",
        2,
        tmp_path / "global_step_2",
    )
    assert find_latest_checkpoint(tmp_path) == tmp_path / "global_step_2"


def test_a_step_already_saved_by_save_freq_is_not_saved_twice(tmp_path):
    trainer, steps_run = stoppable(tmp_path, 3, "trainer.save_freq=3")
    with pytest.raises(Preempted) as info:
        trainer.fit()
    # save_freq=3 saved step 3 at its end; the stop finds it saved: one save in all
    assert (steps_run, info.value.checkpoint, trainer.actor_wg.num_saves) == ([1, 2, 3], tmp_path / "global_step_3", 1)


def test_a_stop_before_the_first_step_saves_nothing(tmp_path):
    trainer, steps_run = stoppable(tmp_path, 0)
    trainer.stop_signals.requested = "SIGINT"
    with pytest.raises(Preempted) as info:
        trainer.fit()
    assert (steps_run, info.value.step, info.value.checkpoint, trainer.actor_wg.num_saves) == ([], 0, None, 0)
