"""A model directory vLLM's CPU kernels accept, written by the tests (nothing is downloaded).

The embedded tiny model (``verl/models/tiny``) has head_dim 16, which vLLM's CPU attention rejects; this one keeps
its tokenizer (character level, vocabulary 50) and has head_dim 64: hidden 128 over 2 query heads (1 key/value
head), 2 layers, tied embeddings, context 64 tokens, about 300k parameters. A wide, seeded init makes the next-token
distributions peaked, so greedy decoding does not hinge on near-ties between two logits.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

TINY_DIR = Path(__file__).resolve().parents[3] / "verl" / "models" / "tiny"

# what every vllm engine of the tests shares: a small KV cache (1% of the RAM) and an eager engine
# the embedded run's settings (batch and micro-batch sizes, lengths) on the head_dim-64 model, which shares the tiny
# model's tokenizer and task: a model path other than `default` gets verl's defaults otherwise
VLLM_TEST_OVERRIDES = ("actor_rollout_ref.rollout.gpu_memory_utilization=0.01", "embedded@_global_=tiny_grpo_fp16")


def needs_vllm():
    """Skip the calling test (or module) where the vllm package is not installed."""
    return pytest.importorskip("vllm", reason="the vllm extra is not installed (scripts/setup_env.sh installs it)")


def write_head_dim_64_model(directory: Path, seed: int = 0) -> Path:
    """Write a seeded random Qwen2 model with head_dim 64 and the tiny model's tokenizer to ``directory``.

    Returns:
        ``directory``, usable as ``actor_rollout_ref.model.path``.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TINY_DIR / name, directory / name)
    config = Qwen2Config(
        vocab_size=50,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).float().save_pretrained(directory, safe_serialization=True)
    return directory
