"""A checkpoint write that fails (disk full, read-only directory) raises one CheckpointWriteError naming the file and
the OS error, whichever writer failed, and the error survives the trip from a worker to the driver (pickling).

The machine runs as root, so a read-only directory cannot be made with chmod: the failures are injected by
replacing the writer with one that raises the OS error, and, for a real full disk, by writing to ``/dev/full``.
"""

import errno
import io
import os
import pickle
import stat
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

import verl.utils.checkpoint as checkpoint
from verl.utils.checkpoint import CheckpointError, CheckpointWriteError, save_state, save_weights, writing


def _has_dev_full() -> bool:
    try:
        return stat.S_ISCHR(os.stat("/dev/full").st_mode)
    except OSError:
        return False


@pytest.mark.skipif(not _has_dev_full(), reason="needs /dev/full, whose every write fails with ENOSPC")
def test_a_full_disk_under_save_state_names_the_file_and_the_os_error():
    # torch.save through its own file writer would say only "unexpected pos"; the OS error must come through
    with pytest.raises(CheckpointWriteError) as info:
        save_state("/dev/full", {"w": torch.zeros(1000)})
    err = info.value
    assert err.errno == errno.ENOSPC and err.path == Path("/dev/full")
    assert str(err) == "cannot write /dev/full: [Errno 28] No space left on device"


class _ShortWritingFile(io.RawIOBase):
    """A raw file whose every write moves at most ``limit`` bytes, as write(2) moves at most 0x7ffff000 on Linux."""

    def __init__(self, path, limit):
        self.file, self.limit = open(path, "wb", buffering=0), limit  # noqa: SIM115 - closed by close()

    def writable(self):
        return True

    def write(self, data):
        return self.file.write(bytes(memoryview(data)[: self.limit]))

    def close(self):
        self.file.close()
        super().close()


def test_a_tensor_larger_than_one_write_is_saved_whole(tmp_path, monkeypatch):
    # torch.save hands a tensor's 4000 bytes over in one write and ignores a short count: on a raw file that moves
    # 1024 bytes per write the file would end 2976 bytes short; the state must load back whole
    def short_writing_open(path, mode="r", buffering=-1, **kwargs):
        raw = _ShortWritingFile(path, limit=1024)
        return raw if buffering == 0 else io.BufferedWriter(raw)

    monkeypatch.setattr(checkpoint, "open", short_writing_open, raising=False)
    state = {"w": torch.arange(1000, dtype=torch.float32)}
    save_state(tmp_path / "train_state.pt", state)
    torch.testing.assert_close(checkpoint.load_state(tmp_path / "train_state.pt")["w"], state["w"])


def test_an_os_error_of_the_weights_writer_is_named(tmp_path, monkeypatch):
    def read_only(tensors, filename):
        raise OSError(errno.EROFS, "Read-only file system", filename)

    monkeypatch.setattr(checkpoint, "save_file", read_only)
    with pytest.raises(CheckpointWriteError) as info:
        save_weights(tmp_path / "model.safetensors", {"w": torch.zeros(2)})
    assert info.value.errno == errno.EROFS and info.value.path == tmp_path / "model.safetensors"
    assert info.value.reason == "[Errno 30] Read-only file system"  # the file is named once, by the error itself


def test_safetensors_io_errors_are_read_for_their_os_error_number(tmp_path, monkeypatch):
    def full_disk(tensors, filename):  # what safetensors (Rust) raises on a full disk
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    with pytest.raises(CheckpointWriteError, match=r"\[Errno 28\] No space left on device") as info:
        save_weights(tmp_path / "model.safetensors", {"w": torch.zeros(2)})
    assert info.value.errno == errno.ENOSPC


def test_other_errors_pass_through_unchanged(tmp_path):
    with pytest.raises(ValueError, match="not a write error"), writing(tmp_path / "x"):
        raise ValueError("not a write error")
    with pytest.raises(SafetensorError, match="share memory"), writing(tmp_path / "x"):
        raise SafetensorError("Some tensors share memory")  # no "(os error N)": not an I/O failure


def test_checkpoint_errors_survive_pickling_from_a_worker(tmp_path):
    # a worker's exception reaches the driver pickled; both errors rebuild from their own arguments
    write = CheckpointWriteError(tmp_path / "a", "[Errno 28] No space left on device", 28, tmp_path / "global_step_4")
    copy = pickle.loads(pickle.dumps(write))
    assert (type(copy), str(copy), copy.errno, copy.checkpoint) == (
        CheckpointWriteError,
        str(write),
        28,
        tmp_path / "global_step_4",
    )
    read = CheckpointError(tmp_path / "b.distcp", "is damaged")
    copy = pickle.loads(pickle.dumps(read))
    assert (type(copy), str(copy), copy.path) == (CheckpointError, str(read), tmp_path / "b.distcp")


def test_while_saving_names_the_rank_and_the_checkpoint_of_a_workers_raw_os_error(tmp_path):
    raw = OSError(errno.EACCES, "Permission denied", str(tmp_path / "x" / "tokenizer.json"))
    raw.rank = 1  # what the worker group attaches to a worker's exception
    err = CheckpointWriteError.while_saving(raw, tmp_path / "global_step_7")
    assert err.path == tmp_path / "x" / "tokenizer.json" and err.errno == errno.EACCES
    assert err.reason == "[Errno 13] Permission denied (on rank 1)"
    assert err.checkpoint == tmp_path / "global_step_7"
    # an OS error without a file name (a failed write() names none) is placed at the checkpoint root
    err = CheckpointWriteError.while_saving(
        OSError(errno.ENOSPC, "No space left on device"), tmp_path / "global_step_7"
    )
    assert err.path == tmp_path and err.reason == "[Errno 28] No space left on device"
