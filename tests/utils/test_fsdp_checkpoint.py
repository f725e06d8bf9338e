"""Damaged FSDP2 (DCP) checkpoints are named by file, and a failed DCP write is a CheckpointWriteError.

DCP runs here in one process without a process group (its no-distributed mode) on a small module with AdamW state:
the files and failure paths are the ones each rank of a sharded run has. The collective save and load on two gloo
ranks are in ``tests/special_distributed/test_fsdp_checkpoint_gloo.py``.
"""

import errno
import warnings

import pytest
import torch
import torch.distributed.checkpoint.filesystem as dcp_filesystem

from verl.utils.checkpoint import CheckpointError, CheckpointWriteError, find_latest_checkpoint, verify_checkpoint
from verl.utils.fsdp_checkpoint import load_sharded, save_sharded, verify_sharded_checkpoint


def _trained_linear(seed: int):
    torch.manual_seed(seed)
    module = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(module.parameters())
    module(torch.ones(2, 4)).sum().backward()
    optimizer.step()  # AdamW state exists: exp_avg, exp_avg_sq, step
    return module, optimizer


@pytest.fixture
def sharded(tmp_path):
    """A complete one-role checkpoint whose actor directory holds a DCP checkpoint, as the fsdp2 backend writes."""
    from verl.utils.checkpoint import save_state, save_weights

    step_dir = tmp_path / "global_step_2"
    module, optimizer = _trained_linear(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP warns that it runs without a process group
        save_sharded(step_dir / "actor" / "sharded", module, optimizer, None)
    save_weights(step_dir / "actor" / "model.safetensors", module.state_dict())
    save_state(step_dir / "actor" / "train_state.pt", {"steps": 1})
    save_state(step_dir / "trainer_state.pt", {"global_step": 2})
    return step_dir


def _load_into_fresh(directory):
    module, optimizer = _trained_linear(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_sharded(directory, module, optimizer, None)
    return module


def test_an_intact_sharded_checkpoint_verifies_and_loads(sharded):
    verify_checkpoint(sharded)
    assert torch.equal(_load_into_fresh(sharded / "actor" / "sharded").weight, _trained_linear(0)[0].weight)


def test_a_truncated_shard_is_named_by_the_driver_and_by_the_loading_rank(sharded):
    shard = sharded / "actor" / "sharded" / "__0_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    # the driver's check before a resume: the file, its size, and the size .metadata says it has
    with pytest.raises(CheckpointError, match=rf"{shard} is damaged: {len(data) // 2} bytes, but \.metadata places "):
        verify_checkpoint(sharded)
    with pytest.raises(CheckpointError, match=f"{shard} is damaged"):
        _load_into_fresh(sharded / "actor" / "sharded")


def test_a_shard_with_garbage_of_the_right_size_is_named_when_read(sharded):
    shard = sharded / "actor" / "sharded" / "__0_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[:16] + b"\0" * (len(data) - 16))  # the sizes agree, the contents do not
    verify_sharded_checkpoint(shard.parent)  # sizes only: passes
    with pytest.raises(CheckpointError, match=f"{shard} could not be read"):
        _load_into_fresh(shard.parent)


def test_a_damaged_metadata_file_is_named(sharded):
    metadata = sharded / "actor" / "sharded" / ".metadata"
    data = metadata.read_bytes()
    metadata.write_bytes(data[: len(data) // 2])
    # a truncated pickle is damage, not a foreign file
    with pytest.raises(CheckpointError, match=rf"{metadata} is damaged or was not written by this trainer \("):
        verify_checkpoint(sharded)


def _global_call_pickle(module: str, name: str, argument: str) -> bytes:
    """A protocol-4 pickle of ``module.name(argument)``: PROTO 4, two short strings, STACK_GLOBAL, the argument in a
    1-tuple, REDUCE, STOP. ``name`` may be dotted: protocol 4 resolves it attribute by attribute."""

    def short_string(text: str) -> bytes:
        data = text.encode()
        return b"\x8c" + bytes([len(data)]) + data

    return b"\x80\x04" + short_string(module) + short_string(name) + b"\x93" + short_string(argument) + b"\x85R."


@pytest.mark.parametrize(
    "module, name",
    [
        ("torch.distributed.checkpoint.filesystem", "os.system"),  # a module DCP's allowed module imports
        ("torch.distributed.checkpoint.metadata", "dataclasses.sys.modules.get"),
        ("torch.distributed.checkpoint.filesystem", "cast"),  # a function the module imports, not one of its classes
    ],
)
def test_metadata_reaching_code_through_an_allowed_module_is_refused_unexecuted(sharded, tmp_path, module, name):
    marker = tmp_path / "ran"
    metadata = sharded / "actor" / "sharded" / ".metadata"
    metadata.write_bytes(_global_call_pickle(module, name, f"touch {marker}"))
    with pytest.raises(CheckpointError, match=rf"names {module}\.{name}, which DCP metadata never holds"):
        verify_checkpoint(sharded)
    assert not marker.exists()


def test_a_sharded_directory_without_its_index_is_incomplete_and_skipped(sharded, caplog):
    older = sharded.parent / "global_step_1"
    older.mkdir()
    for name in ("trainer_state.pt", "actor/model.safetensors", "actor/train_state.pt"):
        (older / name).parent.mkdir(parents=True, exist_ok=True)
        (older / name).write_bytes((sharded / name).read_bytes())
    (sharded / "actor" / "sharded" / ".metadata").unlink()  # what a save killed before rank 0's index leaves
    assert find_latest_checkpoint(sharded.parent) == older
    assert "actor/sharded/.metadata" in caplog.text


def test_a_failed_shard_write_is_a_checkpoint_write_error(tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dcp_filesystem, "_write_item", full_disk)
    module, optimizer = _trained_linear(0)
    with warnings.catch_warnings(), pytest.raises(CheckpointWriteError) as info:
        warnings.simplefilter("ignore")
        save_sharded(tmp_path / "sharded", module, optimizer, None)
    # DCP's own CheckpointException is a BaseException that `except Exception` would miss; this is one error
    # naming the directory, the OS error and the rank whose shards failed
    assert info.value.errno == errno.ENOSPC and info.value.path == tmp_path / "sharded"
    assert info.value.reason == "[Errno 28] No space left on device (rank 0's shards)"
