"""Checkpoint files: damaged or foreign files reported (never executed), incomplete ones skipped, debris removed."""

import logging
import os
import pickle
import shlex
import stat

import pytest
import torch
from safetensors import SafetensorError

import verl.utils.checkpoint as checkpoint
from verl.utils.checkpoint import (
    CheckpointError,
    checkpoints_to_keep,
    find_latest_checkpoint,
    is_complete_checkpoint,
    load_state,
    load_weights,
    missing_checkpoint_files,
    prune_checkpoints,
    remove_save_debris,
    rng_state_path,
    save_state,
    save_weights,
    verify_checkpoint,
)


def _write_checkpoint(step_dir, roles=("actor",)):
    """What the trainer and its workers write: trainer_state.pt and, per role, weights and training state."""
    step_dir.mkdir(parents=True)
    save_state(step_dir / "trainer_state.pt", {"global_step": 3, "data_loader": {"epoch": 0, "position": 12}})
    for role in roles:
        (step_dir / role).mkdir()
        save_weights(step_dir / role / "model.safetensors", {"w": torch.randn(64, 8), "b": torch.zeros(8)})
        save_state(step_dir / role / "train_state.pt", {"optimizer": {"exp_avg": torch.ones(64, 8)}, "steps": 3})
    return step_dir


def _truncate(path, keep_fraction=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])


class Foreign:
    """A harmless class: its pickle is still not something this trainer writes."""


class MarkerPayload:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def _assert_names_file_and_advice(err, path):
    message = str(err)
    assert str(path) in message
    assert "trainer.resume_mode=resume_path trainer.resume_from_path=" in message
    assert "trainer.resume_mode=disable" in message
    # torch's hint to retry with weights_only=False is the wrong advice for a file of unknown origin
    assert "weights_only" not in message


def test_complete_checkpoint_verifies_and_loads(tmp_path):
    step_dir = _write_checkpoint(tmp_path / "global_step_3", roles=("actor", "critic"))
    verify_checkpoint(step_dir, roles=("actor", "critic"))
    assert load_state(step_dir / "trainer_state.pt")["data_loader"]["position"] == 12
    assert load_weights(step_dir / "critic" / "model.safetensors")["w"].shape == (64, 8)


def test_truncated_weights_are_reported(tmp_path):
    step_dir = _write_checkpoint(tmp_path / "global_step_3")
    weights = step_dir / "actor" / "model.safetensors"
    _truncate(weights)
    with pytest.raises(CheckpointError) as info:
        verify_checkpoint(step_dir)
    _assert_names_file_and_advice(info.value, weights)
    assert info.value.path == weights
    with pytest.raises(CheckpointError) as info:
        load_weights(weights)
    _assert_names_file_and_advice(info.value, weights)
    assert isinstance(info.value.__cause__, SafetensorError)
    assert isinstance(info.value, RuntimeError)


@pytest.mark.parametrize("extra_bytes", [-4, 4], ids=["short", "long"])
def test_size_check_catches_what_the_header_does_not_cover(tmp_path, monkeypatch, extra_bytes):
    step_dir = _write_checkpoint(tmp_path / "global_step_3")
    weights = step_dir / "actor" / "model.safetensors"
    size = weights.stat().st_size
    data = weights.read_bytes()
    weights.write_bytes(data[:extra_bytes] if extra_bytes < 0 else data + b"\0" * extra_bytes)

    # our own size check, independent of what the installed safetensors version validates on open
    class LenientOpen:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def keys(self):
            return []

    monkeypatch.setattr(checkpoint, "safe_open", LenientOpen)
    # the header describes the original size: 8 + header + 64*8*4 + 8*4 bytes
    with pytest.raises(CheckpointError, match=f"{size + extra_bytes} bytes, but its header describes {size} bytes"):
        verify_checkpoint(step_dir)


@pytest.mark.parametrize("name", ["trainer_state.pt", "actor/train_state.pt"])
def test_truncated_state_files_are_reported(tmp_path, name):
    step_dir = _write_checkpoint(tmp_path / "global_step_3")
    path = step_dir / name
    _truncate(path)
    with pytest.raises(CheckpointError) as info:
        verify_checkpoint(step_dir)
    _assert_names_file_and_advice(info.value, path)
    with pytest.raises(CheckpointError) as info:
        load_state(path)
    _assert_names_file_and_advice(info.value, path)
    assert info.value.__cause__ is not None


@pytest.mark.parametrize("name", ["trainer_state.pt", "actor/train_state.pt"])
@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_foreign_pickles_are_rejected(tmp_path, name, writer):
    step_dir = _write_checkpoint(tmp_path / "global_step_3")
    path = step_dir / name
    if writer == "pickle":
        path.write_bytes(pickle.dumps(Foreign()))
    else:
        torch.save({"state": Foreign()}, path)
    with pytest.raises(CheckpointError, match="not written by this trainer") as info:
        verify_checkpoint(step_dir)
    _assert_names_file_and_advice(info.value, path)
    with pytest.raises(CheckpointError, match="not written by this trainer"):
        load_state(path)


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_code_in_a_state_file_is_never_executed(tmp_path, writer):
    # the payload is live: unpickled without weights_only it creates its marker
    probe = tmp_path / "probe_marker"
    pickle.loads(pickle.dumps(MarkerPayload(probe)))
    assert probe.exists()

    step_dir = _write_checkpoint(tmp_path / "global_step_3")
    marker = tmp_path / "marker"
    path = step_dir / "actor" / "train_state.pt"
    if writer == "pickle":
        path.write_bytes(pickle.dumps(MarkerPayload(marker)))
    else:
        torch.save({"optimizer": MarkerPayload(marker)}, path)
    with pytest.raises(CheckpointError):
        verify_checkpoint(step_dir)
    with pytest.raises(CheckpointError):
        load_state(path)
    assert not marker.exists()


def test_state_file_that_is_not_a_dict_is_rejected(tmp_path):
    step_dir = _write_checkpoint(tmp_path / "global_step_3")
    torch.save([1, 2, 3], step_dir / "trainer_state.pt")
    with pytest.raises(CheckpointError, match="holds a list"):
        verify_checkpoint(step_dir)


def test_damaged_rollout_state_is_reported(tmp_path):
    step_dir = _write_checkpoint(tmp_path / "global_step_3")
    rng_state = rng_state_path(step_dir / "actor", rank=1)
    assert rng_state == step_dir / "actor" / "rng_state_rank1.pt"
    save_state(rng_state_path(step_dir / "actor", rank=0), {"generators": {"cpu": torch.zeros(8, dtype=torch.uint8)}})
    save_state(rng_state, {"generators": {}})
    verify_checkpoint(step_dir)
    _truncate(rng_state)
    with pytest.raises(CheckpointError) as info:
        verify_checkpoint(step_dir)
    assert info.value.path == rng_state


def test_missing_files_are_named(tmp_path):
    step_dir = _write_checkpoint(tmp_path / "global_step_3")
    assert missing_checkpoint_files(step_dir, ("actor", "critic")) == [
        "critic/model.safetensors",
        "critic/train_state.pt",
    ]
    assert not is_complete_checkpoint(step_dir, ("actor", "critic"))
    assert is_complete_checkpoint(step_dir, ("actor",))
    with pytest.raises(CheckpointError, match="is missing") as info:
        verify_checkpoint(step_dir, ("actor", "critic"))
    assert info.value.path == step_dir / "critic" / "model.safetensors"
    with pytest.raises(CheckpointError, match="is missing"):
        load_state(step_dir / "critic" / "train_state.pt")


def _write_tensor_parallel_shards(role_dir, tp_ranks):
    """What megatron's tensor-parallel save writes per rank: mp_rank_XX/ with that rank's weights and state (a
    (tensor-parallel rank, stage) pair: mp_rank_XX_YYY/, as with pipeline stages)."""
    for rank in tp_ranks:
        name = f"mp_rank_{rank[0]:02d}_{rank[1]:03d}" if isinstance(rank, tuple) else f"mp_rank_{rank:02d}"
        shard = role_dir / name
        shard.mkdir()
        save_weights(shard / "model.safetensors", {"w": torch.randn(32, 8)})
        save_state(shard / "train_state.pt", {"steps": 3})


def test_a_missing_tensor_parallel_shard_makes_the_checkpoint_incomplete(tmp_path):
    step_dir = _write_checkpoint(tmp_path / "global_step_3")
    _write_tensor_parallel_shards(step_dir / "actor", [0, 2])  # rank 1's shard never came: a gap, not tp=2
    assert missing_checkpoint_files(step_dir) == [
        "actor/mp_rank_01/model.safetensors",
        "actor/mp_rank_01/train_state.pt",
    ]
    _write_tensor_parallel_shards(step_dir / "actor", [1])
    assert is_complete_checkpoint(step_dir)


def test_a_missing_pipeline_stage_makes_the_checkpoint_incomplete(tmp_path):
    step_dir = _write_checkpoint(tmp_path / "global_step_3")
    # tensor-parallel size 2, three stages: stage 1 of tensor-parallel rank 1 never came
    _write_tensor_parallel_shards(step_dir / "actor", [(0, 0), (0, 1), (0, 2), (1, 0), (1, 2)])
    assert missing_checkpoint_files(step_dir) == [
        "actor/mp_rank_01_001/model.safetensors",
        "actor/mp_rank_01_001/train_state.pt",
    ]
    _write_tensor_parallel_shards(step_dir / "actor", [(1, 1)])
    assert is_complete_checkpoint(step_dir)


def test_a_truncated_tensor_parallel_shard_is_named(tmp_path):
    step_dir = _write_checkpoint(tmp_path / "global_step_3")
    _write_tensor_parallel_shards(step_dir / "actor", [0, 1])
    verify_checkpoint(step_dir)
    _truncate(step_dir / "actor" / "mp_rank_01" / "model.safetensors")
    with pytest.raises(CheckpointError) as info:
        verify_checkpoint(step_dir)
    _assert_names_file_and_advice(info.value, step_dir / "actor" / "mp_rank_01" / "model.safetensors")


def test_latest_complete_checkpoint_is_found_and_incomplete_ones_are_skipped(tmp_path, caplog):
    _write_checkpoint(tmp_path / "global_step_2")
    _write_checkpoint(tmp_path / "global_step_4")
    # what a non-atomic copy leaves: only the first file made it
    (tmp_path / "global_step_10" / "actor").mkdir(parents=True)
    save_weights(tmp_path / "global_step_10" / "actor" / "model.safetensors", {"w": torch.ones(2)})
    (tmp_path / ".global_step_12.tmp-abc").mkdir()  # debris is never a candidate
    with caplog.at_level(logging.WARNING, logger="verl.utils.checkpoint"):
        # numeric order: 10 > 4 > 2, though "global_step_10" < "global_step_4" as strings
        assert find_latest_checkpoint(tmp_path) == tmp_path / "global_step_4"
    skipped = [r.getMessage() for r in caplog.records]
    assert len(skipped) == 1
    assert str(tmp_path / "global_step_10") in skipped[0]
    assert "trainer_state.pt, actor/train_state.pt" in skipped[0]


def test_roles_decide_completeness(tmp_path):
    _write_checkpoint(tmp_path / "global_step_2", roles=("actor", "critic"))
    _write_checkpoint(tmp_path / "global_step_4", roles=("actor",))
    assert find_latest_checkpoint(tmp_path, roles=("actor",)) == tmp_path / "global_step_4"
    assert find_latest_checkpoint(tmp_path, roles=("actor", "critic")) == tmp_path / "global_step_2"


def test_no_complete_checkpoint_gives_none(tmp_path):
    assert find_latest_checkpoint(tmp_path / "absent") is None
    (tmp_path / "global_step_1").mkdir()
    assert find_latest_checkpoint(tmp_path) is None


def test_remove_save_debris_removes_only_the_two_patterns(tmp_path, caplog):
    root = tmp_path / "ckpts"
    _write_checkpoint(root / "global_step_3")
    tmp_debris = root / ".global_step_5.tmp-k2j3"
    (tmp_debris / "actor").mkdir(parents=True)
    old_debris = root / ".global_step_3.old-4242"  # global_step_3 exists: the swap finished
    old_debris.mkdir()
    kept = [
        root / ".global_step_6.tmp-file",  # a file, not a directory
        root / ".ckpt.tmp-x",  # not a global_step_N name
        root / "global_step_3",
        root / "sub" / ".global_step_7.tmp-x",  # not directly under root
    ]
    kept[0].write_text("not a directory")
    kept[1].mkdir()
    kept[3].mkdir(parents=True)
    with caplog.at_level(logging.INFO, logger="verl.utils.checkpoint"):
        removed = remove_save_debris(root)
    assert removed == [old_debris, tmp_debris]
    assert not tmp_debris.exists() and not old_debris.exists()
    assert all(path.exists() for path in kept)
    assert str(tmp_debris) in caplog.text and str(old_debris) in caplog.text
    assert remove_save_debris(root) == []
    assert remove_save_debris(tmp_path / "absent") == []


def test_remove_save_debris_restores_a_checkpoint_moved_aside_by_an_interrupted_swap(tmp_path):
    # atomic_directory moves global_step_3 to .old-*, then the new copy in; a crash between the two leaves
    # global_step_3 absent and its last good copy under the .old-* name
    _write_checkpoint(tmp_path / ".global_step_3.old-77")
    (tmp_path / ".global_step_3.tmp-new").mkdir()
    assert remove_save_debris(tmp_path) == [tmp_path / ".global_step_3.tmp-new"]
    assert is_complete_checkpoint(tmp_path / "global_step_3")
    assert find_latest_checkpoint(tmp_path) == tmp_path / "global_step_3"


def test_debris_that_cannot_be_removed_is_left_with_a_warning(tmp_path, monkeypatch, caplog):
    # a killed rank's write still landing (rmtree's ENOTEMPTY on a network filesystem): the run goes on, the debris is
    # never a candidate, and the next start tries again
    (tmp_path / ".global_step_5.tmp-k2j3" / "actor").mkdir(parents=True)
    _write_checkpoint(tmp_path / "global_step_3")

    def busy(path, *args, **kwargs):
        raise OSError(39, "Directory not empty", str(path))

    monkeypatch.setattr(checkpoint.shutil, "rmtree", busy)
    with caplog.at_level(logging.WARNING, logger="verl.utils.checkpoint"):
        assert remove_save_debris(tmp_path) == []
    assert f"could not remove {tmp_path / '.global_step_5.tmp-k2j3'} ([Errno 39] Directory not empty)" in caplog.text
    assert find_latest_checkpoint(tmp_path) == tmp_path / "global_step_3"


def test_symlink_named_like_debris_is_not_followed(tmp_path):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    root = tmp_path / "ckpts"
    root.mkdir()
    (root / ".global_step_1.tmp-link").symlink_to(target)
    assert remove_save_debris(root) == []
    assert (target / "keep.txt").exists()


def test_prune_keeps_the_newest_complete_checkpoints(tmp_path):
    for step in (2, 4, 6, 8):
        _write_checkpoint(tmp_path / f"global_step_{step}")
    (tmp_path / "global_step_1").mkdir()  # incomplete: neither counted nor deleted
    _write_checkpoint(tmp_path / "global_step_10")  # a later step, left by an earlier run this one resumed past
    removed = prune_checkpoints(tmp_path, tmp_path / "global_step_8", keep=2)
    # keep=2 = the one just saved (8) plus the newest older complete one (6); 2 and 4 go, oldest first
    assert removed == [tmp_path / "global_step_2", tmp_path / "global_step_4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "global_step_1",
        "global_step_10",
        "global_step_6",
        "global_step_8",
    ]


def test_prune_with_keep_one_leaves_only_the_newest_and_none_keeps_all(tmp_path):
    for step in (1, 2, 3):
        _write_checkpoint(tmp_path / f"global_step_{step}")
    assert prune_checkpoints(tmp_path, tmp_path / "global_step_3", keep=None) == []
    assert prune_checkpoints(tmp_path, tmp_path / "global_step_3", keep=1) == [
        tmp_path / "global_step_1",
        tmp_path / "global_step_2",
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["global_step_3"]
    with pytest.raises(ValueError, match="at least 1"):
        prune_checkpoints(tmp_path, tmp_path / "global_step_3", keep=0)


def test_prune_counts_only_checkpoints_complete_for_every_role(tmp_path):
    _write_checkpoint(tmp_path / "global_step_1", roles=("actor", "critic"))
    _write_checkpoint(tmp_path / "global_step_2", roles=("actor",))  # no critic: not a checkpoint of this run
    _write_checkpoint(tmp_path / "global_step_3", roles=("actor", "critic"))
    removed = prune_checkpoints(tmp_path, tmp_path / "global_step_3", keep=1, roles=("actor", "critic"))
    assert removed == [tmp_path / "global_step_1"] and (tmp_path / "global_step_2").is_dir()


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ([3], 3),
        ([None], None),
        ([2, 5], 5),  # one directory holds both roles: the larger limit keeps what each role asked for
        ([2, None], None),  # a role that keeps everything keeps every directory
    ],
)
def test_checkpoints_to_keep_takes_the_most_generous_role(limits, expected):
    assert checkpoints_to_keep(limits) == expected


def test_a_checkpoint_directory_gets_the_umask_permissions(tmp_path):
    from verl.utils.checkpoint import atomic_directory

    previous = os.umask(0o022)
    try:
        with atomic_directory(tmp_path / "global_step_1") as tmp:
            (tmp / "model.safetensors").write_bytes(b"")
    finally:
        os.umask(previous)
    # 0o777 & ~0o022: readable by the group and others, like the files in it (a temporary directory would be 0700)
    assert stat.S_IMODE((tmp_path / "global_step_1").stat().st_mode) == 0o755
