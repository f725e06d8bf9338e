"""Shared fixtures for the megatron-core model tests: a single-process gloo group and tiny HF configs."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config

from verl.models.mcore import ensure_model_parallel_initialized

TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 64,
    "intermediate_size": 64,
    "max_position_embeddings": 128,
}


@pytest.fixture(scope="package", autouse=True)
def mcore_parallel():
    """megatron's groups over a world of one process (gloo on a free port), torn down after these tests."""
    from megatron.core import parallel_state

    ensure_model_parallel_initialized(tp=1, pp=1)
    assert torch.distributed.get_world_size() >= 1
    yield
    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _tiny_config(arch: str, tie: bool = False, **kwargs: object) -> Qwen2Config | LlamaConfig:
    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}[arch]
    return cls(**{**TINY, **kwargs}, tie_word_embeddings=tie, attn_implementation="eager")


@pytest.fixture
def make_config():
    """Factory ``make_config(arch, tie=False, **overrides)`` of two-layer GQA configs (eager HF attention)."""
    return _tiny_config
