"""``Worker.init_torch_distributed`` on CUDA: NCCL, the device of the local rank, and the collectives the actors use.

A worker joins the default process group with NCCL when CUDA is there, after ``torch.cuda.set_device`` picks the
GPU of its local rank; the FSDP2 workers ask for one group for both kinds of tensor (``cpu:gloo,cuda:nccl``). Each
check joins a world of one rank (one GPU), runs the collectives the update path runs (SUM and MAX all-reduces of
CUDA tensors) and a ``dp`` actor update inside the group. The CPU variant joins with gloo.

``verl.single_controller``'s package imports Ray for its worker group; the ``Worker`` base class itself needs none,
and the GPU machine has no Ray, so the worker module is loaded without the package's ``__init__`` there.
"""

import importlib
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.special_gpu.checks import NEEDS_CUDA
from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
from verl.workers.actor.dp_actor import build_dp_actor

CUDA = [pytest.mark.gpu, NEEDS_CUDA]
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=CUDA)]


def worker_class():
    """``verl.single_controller.worker.Worker``, imported without Ray where Ray is missing."""
    try:
        import ray  # noqa: F401
    except ImportError:
        if "verl.single_controller" not in sys.modules:
            import verl

            package = types.ModuleType("verl.single_controller")
            package.__path__ = [str(Path(verl.__file__).parent / "single_controller")]
            sys.modules["verl.single_controller"] = package
    return importlib.import_module("verl.single_controller.worker").Worker


@pytest.fixture
def one_rank_env(monkeypatch):
    """A worker started by hand as rank 0 of 1, local rank 1 of 2 (its GPU: local rank modulo the GPU count)."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("device", DEVICES)
def test_a_worker_joins_with_nccl_on_the_gpu_of_its_local_rank(device, one_rank_env, figure):
    worker = worker_class()()
    assert worker.init_torch_distributed() is True
    assert worker.init_torch_distributed() is False  # once per process
    assert dist.get_world_size() == 1 and dist.get_rank() == 0
    if device == "cuda":
        assert dist.get_backend() == "nccl"
        assert torch.cuda.current_device() == 1 % torch.cuda.device_count()
        figure("cuda_device", torch.cuda.current_device())
    else:
        assert dist.get_backend() == "gloo"
    values = torch.tensor([1.5, -2.0, 3.0], device=device)
    total, largest = values.clone(), values.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    # one rank: the sum and the max over the ranks are the rank's own values
    assert torch.equal(total, values) and torch.equal(largest, values)


@pytest.mark.gpu
@NEEDS_CUDA
def test_one_group_carries_cpu_tensors_over_gloo_and_cuda_tensors_over_nccl(one_rank_env):
    torch.cuda.set_device(1 % torch.cuda.device_count())  # as the FSDP2 workers do before joining
    worker = worker_class()()
    assert worker.init_torch_distributed(backend="cpu:gloo,cuda:nccl") is True
    for device in ("cpu", "cuda"):
        flag = torch.tensor([0.0, 1.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        assert flag.tolist() == [0.0, 1.0]


@pytest.mark.parametrize("device", DEVICES)
def test_a_dp_update_inside_the_group_equals_one_without_a_group(device, one_rank_env, figure):
    worker_class()().init_torch_distributed()

    def actor(process_group):
        return build_dp_actor(
            actor_config(dtype="float16", optim={"lr": 1e-2, "initial_loss_scale": 1024.0}),
            tiny_qwen2(seed=0).to(device),
            total_training_steps=10,
            process_group=process_group,
        )

    grouped, alone = actor(dist.group.WORLD), actor(None)
    batch = ppo_batch().to(device)
    for _ in range(2):
        metrics, reference = grouped.update_policy(batch).metrics, alone.update_policy(batch).metrics
        assert metrics["actor/update_failed"] == reference["actor/update_failed"] == 0.0
        # equal up to the summation order of CUDA kernels (one rank: averaging over the group changes nothing)
        assert abs(metrics["actor/grad_norm"] - reference["actor/grad_norm"]) <= 1e-5 * reference["actor/grad_norm"]
    figure("grad_norm", metrics["actor/grad_norm"])
    for a, b in zip(grouped.model_module().parameters(), alone.model_module().parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
