"""Shared fixtures for the actor tests: a tiny random Qwen2 model and a PPO batch in the rollout layout."""

import pytest
import torch
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.protocol import DataProto
from verl.workers.config import ActorConfig, load_section

VOCAB, PROMPT, RESPONSE = 32, 4, 4


@pytest.fixture(scope="module")
def megatron_world_of_one():
    """megatron-core's groups exist only while one module's tests run (other tests expect no process group)."""
    yield
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    """FSDP2 needs a process group even for one rank; other test modules expect none, so it ends with the module."""
    import torch.distributed as dist

    store = tmp_path_factory.mktemp("store") / "rendezvous"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def tiny_qwen2(seed=0, vocab=VOCAB):
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        attn_implementation="eager",
    )
    return Qwen2ForCausalLM(config).float()


def actor_config(**overrides):
    """The YAML's actor section with the test sizes (ppo_mini_batch_size counts samples on the one rank here)."""
    base = {
        "dtype": "float32",
        "ppo_mini_batch_size": 8,
        "ppo_micro_batch_size_per_gpu": 4,
        "optim": {"lr": 1e-2},
    }
    merged = OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(overrides))
    return load_section(ActorConfig, OmegaConf.to_container(merged))


def ppo_batch(num_samples=8, seed=0, temperature=1.0):
    """Left-padded prompts, right-padded responses, advantages +1 for even rows and -1 for odd rows; the sampling
    ``temperature`` in meta_info, as the workers set it from ``actor_rollout_ref.rollout.temperature``."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, VOCAB, (num_samples, PROMPT), generator=gen)
    responses = torch.randint(3, VOCAB, (num_samples, RESPONSE), generator=gen)
    attention_mask = torch.ones(num_samples, PROMPT + RESPONSE, dtype=torch.long)
    attention_mask[0, 0] = 0  # one left-padded prompt
    attention_mask[1, -1] = 0  # one response that ended early
    prompts[0, 0] = 0
    responses[1, -1] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(num_samples)])
    response_mask = attention_mask[:, PROMPT:].clone()
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=-1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": response_mask,
            "advantages": sign[:, None].expand(-1, RESPONSE) * response_mask,
            "old_log_probs": torch.zeros(num_samples, RESPONSE),
        },
        meta_info={"temperature": temperature},
    )


def megatron_lora(**overrides):
    """verl's megatron LoRA keys (``actor_rollout_ref.model.lora``) as the megatron builder reads them: rank 4 on
    every linear layer kind; ``overrides`` replace any of them."""
    from types import SimpleNamespace

    settings = {
        "rank": 4,
        "alpha": 8,
        "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
        "exclude_modules": [],
        "dropout": 0.0,
        "dropout_position": "pre",
        "lora_A_init_method": "kaiming",
        "lora_B_init_method": "zero",
    }
    return SimpleNamespace(**{**settings, **overrides})
