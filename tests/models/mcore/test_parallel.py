"""Tests for verl.models.mcore.parallel: idempotent megatron group setup, size checks, CPU-safe seeding."""

from __future__ import annotations

import pytest
import torch
from megatron.core import parallel_state

from verl.models.mcore import ensure_model_parallel_initialized, set_model_parallel_seed


def test_single_process_groups_are_idempotent():
    ensure_model_parallel_initialized(tp=1, pp=1)
    ensure_model_parallel_initialized(tp=1, pp=1)  # a second call must not re-create groups
    assert parallel_state.model_parallel_is_initialized()
    world_size = torch.distributed.get_world_size()
    # dp = world / (tp * pp) = world here
    assert parallel_state.get_data_parallel_world_size() == world_size
    assert parallel_state.get_tensor_model_parallel_world_size() == 1


def test_conflicting_or_invalid_sizes_are_errors():
    with pytest.raises(ValueError, match="already initialised with tp=1, pp=1"):
        ensure_model_parallel_initialized(tp=2, pp=1)
    with pytest.raises(ValueError, match=">= 1"):
        ensure_model_parallel_initialized(tp=0, pp=1)


def test_seed_is_cpu_safe_and_reproducible():
    set_model_parallel_seed(7)
    first = torch.rand(3)
    set_model_parallel_seed(7)
    assert torch.equal(torch.rand(3), first)


def test_groups_of_a_destroyed_process_group_are_rebuilt():
    # Another library in the process may destroy the default group and make a new one; megatron-core's groups
    # from before are then unusable, and the next model build must rebuild them instead of failing.
    import torch.distributed as dist
    from megatron.core import parallel_state

    from verl.models.mcore.parallel import ensure_model_parallel_initialized

    ensure_model_parallel_initialized()
    dist.destroy_process_group()
    ensure_model_parallel_initialized()
    assert parallel_state.get_pipeline_model_parallel_rank() == 0  # raised "Group ... is not registered" before
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
