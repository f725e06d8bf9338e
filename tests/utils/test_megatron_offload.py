"""Tests for verl.utils.megatron_offload: storages moved out and back, views kept; CPU means nothing moves."""

from __future__ import annotations

import pytest
import torch

from verl.utils.megatron_offload import MegatronOffloader, StorageOffload, attach_offloader, offload_phase


def test_storages_move_out_and_back_with_views_kept():
    buffer = torch.arange(12.0)  # a contiguous buffer, as megatron-core DDP's gradient buffer
    first, second = buffer[:6].view(2, 3), buffer[6:]
    param = torch.nn.Parameter(torch.ones(4))
    moved = StorageOffload([first, second, param], skip_cpu=False)
    # two storages: the buffer (12 float32 = 48 bytes, counted once for its two views) and the parameter (16 bytes)
    assert moved.num_bytes == 64
    moved.offload()
    assert buffer.untyped_storage().nbytes() == 0 and param.untyped_storage().nbytes() == 0
    assert moved.num_bytes == 64  # now held in host copies
    moved.onload()
    assert torch.equal(first, torch.arange(6.0).view(2, 3)) and torch.equal(second, torch.arange(6.0, 12.0))
    assert torch.equal(param, torch.ones(4)) and param.requires_grad


def test_host_memory_tensors_do_not_move_on_cpu():
    model = torch.nn.Linear(3, 2)
    offloader = MegatronOffloader(model, None, param_offload=True, grad_offload=True, optimizer_offload=True)
    offloader.offload()
    assert offloader.offloaded_bytes == 0  # already in host memory: what the keys mean on CPU
    assert model.weight.untyped_storage().nbytes() == 3 * 2 * 4


def _train_step(model, optimizer):
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()


def test_a_training_phase_gets_everything_back_and_matches_a_run_without_offload():
    torch.manual_seed(0)
    plain = torch.nn.Linear(3, 2)
    offloaded = torch.nn.Linear(3, 2)
    offloaded.load_state_dict(plain.state_dict())
    opt_plain, opt_off = torch.optim.AdamW(plain.parameters()), torch.optim.AdamW(offloaded.parameters())
    owner = type("Owner", (), {"model": offloaded, "optimizer": opt_off})()
    megatron = type("Section", (), {"param_offload": True, "grad_offload": True, "optimizer_offload": True})()
    _train_step(plain, opt_plain)
    _train_step(offloaded, opt_off)  # creates the Adam moments before the offloader is attached
    attach_offloader(owner, megatron, skip_cpu=False)
    # weight 6 + bias 2 float32 = 32 bytes of parameters; grads the same 32; exp_avg and exp_avg_sq 2 x 32
    assert owner.offloader.offloaded_bytes == 32 + 32 + 64
    assert offloaded.weight.untyped_storage().nbytes() == 0
    with offload_phase(owner, training=False):  # a forward phase: parameters only
        assert offloaded.weight.untyped_storage().nbytes() == 24
        assert opt_off.state[offloaded.weight]["exp_avg"].untyped_storage().nbytes() == 0
    with offload_phase(owner, training=True):
        opt_off.zero_grad()
        _train_step(offloaded, opt_off)
    opt_plain.zero_grad()
    _train_step(plain, opt_plain)
    with offload_phase(owner, training=False):
        assert torch.equal(offloaded.weight, plain.weight) and torch.equal(offloaded.bias, plain.bias)


def test_no_offloader_without_offload_keys():
    owner = type("Owner", (), {"model": torch.nn.Linear(2, 2)})()
    section = type("Section", (), {"param_offload": False, "grad_offload": False, "optimizer_offload": False})()
    attach_offloader(owner, section)
    assert owner.offloader is None
    with offload_phase(owner, training=True):
        assert owner.model.weight.untyped_storage().nbytes() == 16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_parameters_leave_the_device_between_phases():
    model = torch.nn.Linear(1024, 1024, bias=False).cuda()  # 4 MiB of float32
    before = torch.cuda.memory_allocated()
    offloader = MegatronOffloader(model, None, param_offload=True, grad_offload=False, optimizer_offload=False)
    offloader.offload()
    assert offloader.offloaded_bytes == 1024 * 1024 * 4
    assert torch.cuda.memory_allocated() <= before - 1024 * 1024 * 4
    with offloader.phase(training=False):
        assert model.weight.is_cuda and model.weight.untyped_storage().nbytes() == 1024 * 1024 * 4
