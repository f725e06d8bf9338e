"""Tests for verl.single_controller.worker: reading the rank from the environment and a one-rank process group."""

import os

import pytest
import torch
import torch.distributed as dist

from verl.single_controller.worker import (
    COLLECTIVE_TIMEOUT_ENV,
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    Worker,
    collective_timeout_s,
    find_free_port,
)


def test_defaults_without_environment(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    worker = Worker()
    assert (worker.rank, worker.world_size, worker.local_rank, worker.local_world_size) == (0, 1, 0, 1)
    assert worker.master_addr == "127.0.0.1" and worker.master_port is None


def test_reads_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    worker = Worker()
    # rank 2 of 4 with 2 ranks per node: the first rank of the second node
    assert (worker.rank, worker.world_size, worker.local_rank, worker.local_world_size) == (2, 4, 0, 2)
    assert (worker.master_addr, worker.master_port) == ("10.0.0.1", 29500)


@pytest.mark.parametrize(("name", "value"), [("RANK", "x"), ("WORLD_SIZE", "0"), ("RANK", "-1")])
def test_rejects_malformed_environment(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        Worker()


def test_rejects_local_rank_outside_node(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="not below LOCAL_WORLD_SIZE"):
        Worker()


def test_set_rendezvous_replaces_the_address_and_exports_it(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    worker = Worker()
    # recorded by monkeypatch, so the values set_rendezvous exports are undone after the test
    monkeypatch.setenv("MASTER_ADDR", "unused")
    monkeypatch.setenv("MASTER_PORT", "1")
    worker.set_rendezvous("10.1.2.3", 29511)
    assert (worker.master_addr, worker.master_port) == ("10.1.2.3", 29511)
    # libraries that read the environment see rank 0's address too
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("10.1.2.3", "29511")


def test_collective_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(COLLECTIVE_TIMEOUT_ENV, raising=False)
    assert collective_timeout_s() == DEFAULT_COLLECTIVE_TIMEOUT_S
    monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, "45.5")
    assert collective_timeout_s() == 45.5
    for bad in ("0", "-3", "soon"):
        monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=COLLECTIVE_TIMEOUT_ENV):
            collective_timeout_s()


def test_rejects_rank_outside_world(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="not below WORLD_SIZE"):
        Worker()


def test_multi_rank_world_needs_master_port(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    # other tests in this process may have joined a world of one already; this check must still run
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    with pytest.raises(ValueError, match="MASTER_PORT"):
        Worker().init_torch_distributed(backend="gloo")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised on a machine without CUDA")
def test_nccl_without_cuda_is_rejected(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="gloo"):
        Worker().init_torch_distributed(backend="nccl")


def test_single_rank_process_group(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert not dist.is_initialized(), "another test left a process group behind"
    worker = Worker()
    try:
        assert worker.init_torch_distributed(backend="gloo") is True
        assert worker.init_torch_distributed() is False  # second call is a no-op
        tensor = torch.tensor([3.0])
        dist.all_reduce(tensor)
        assert tensor.item() == 3.0  # a world of one: the sum is the value itself
        assert worker.master_port is not None
    finally:
        dist.destroy_process_group()


def test_find_free_port_is_bindable():
    port = find_free_port()
    assert 0 < port < 65536


def test_the_worker_side_imports_without_ray():
    # The GPU checks' image has no Ray: a worker built by hand must import; the driver's names load Ray on use.
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['ray'] = None\n"  # any `import ray` now raises ImportError
        "from verl.single_controller import Dispatch, Worker, register\n"
        "try:\n"
        "    from verl.single_controller import RayWorkerGroup\n"
        "except ImportError:\n"
        "    print('driver side needs ray')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "driver side needs ray"
