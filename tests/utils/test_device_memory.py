"""Tests for verl.utils.device_memory: a release waits for the device, then empties the cache; a no-op without CUDA;
megatron's offloader releases after every offload that moved something (and only then)."""

import pytest
import torch

from tests.utils.device_calls import num_releases, record_device_calls
from verl.utils import device_memory
from verl.utils.megatron_offload import MegatronOffloader, attach_offloader, offload_phase


@pytest.fixture
def device_calls(monkeypatch) -> list[str]:
    return record_device_calls(monkeypatch)


def test_a_release_synchronizes_before_it_empties_the_cache(device_calls):
    assert device_memory.release_device_memory() is True
    # the sync first: blocks still used by queued kernels or copies are only returned once that work is done
    assert device_calls == ["synchronize", "empty_cache"]


def test_without_a_cuda_context_nothing_is_called(monkeypatch):
    calls = []
    monkeypatch.setattr(device_memory, "cuda_in_use", lambda: False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    assert device_memory.release_device_memory() is False
    assert calls == []


def test_this_cpu_machine_has_no_cuda_context_to_release():
    # no monkeypatching: the real check (a CUDA machine that never used CUDA answers the same)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("this process uses CUDA")
    assert device_memory.release_device_memory() is False


def test_a_phase_releases_after_it_ends_even_when_it_raises(device_calls):
    with device_memory.releasing_device_memory(False):
        pass
    assert device_calls == []  # not enabled: no sync, no release
    with device_memory.releasing_device_memory(True):
        assert device_calls == []  # nothing before the phase's work
    assert num_releases(device_calls) == 1
    with pytest.raises(RuntimeError), device_memory.releasing_device_memory(True):
        raise RuntimeError("the phase failed")
    assert num_releases(device_calls) == 2


def _owner_and_section(param_offload: bool):
    owner = type("Owner", (), {"model": torch.nn.Linear(3, 2), "optimizer": None})()
    section = type("Section", (), {"param_offload": param_offload, "grad_offload": False, "optimizer_offload": False})
    return owner, section()


def test_megatron_offload_releases_once_per_offload_that_moved_storages(device_calls):
    owner, section = _owner_and_section(param_offload=True)
    attach_offloader(owner, section, skip_cpu=False)  # the CUDA code path on host storages
    assert owner.offloader.offloaded_bytes == (3 * 2 + 2) * 4  # weight and bias, float32
    assert num_releases(device_calls) == 1  # the first offload, at attach time
    for training in (False, True):
        with offload_phase(owner, training=training):
            assert num_releases(device_calls) == 1 + (1 if training else 0)  # the onload releases nothing
    assert num_releases(device_calls) == 3  # one more after each phase


def test_megatron_offload_that_moves_nothing_releases_nothing(device_calls):
    owner, section = _owner_and_section(param_offload=True)
    attach_offloader(owner, section)  # on CPU production skips host storages: 0 bytes move
    assert owner.offloader.offloaded_bytes == 0
    with offload_phase(owner, training=True):
        pass
    offloader = MegatronOffloader(owner.model, None, param_offload=False, grad_offload=False, optimizer_offload=False)
    offloader.offload()
    assert device_calls == []
