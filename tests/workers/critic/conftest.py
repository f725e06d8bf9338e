"""Shared helpers for the critic tests: a critic config and a PPO batch carrying old values and returns."""

import torch
from omegaconf import OmegaConf

from tests.workers.actor.conftest import RESPONSE, ppo_batch
from verl.workers.config import CriticConfig, load_section


def critic_config(**overrides):
    """The YAML's critic section with the test sizes (ppo_mini_batch_size counts samples on the one rank here)."""
    base = {
        "dtype": "float32",
        "ppo_mini_batch_size": 8,
        "ppo_micro_batch_size_per_gpu": 4,
        "forward_micro_batch_size_per_gpu": 8,
        "optim": {"lr": 3e-3},
    }
    merged = OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(overrides))
    return load_section(CriticConfig, OmegaConf.to_container(merged))


def value_batch(num_samples=8, seed=0):
    """The actor tests' batch plus old values (zeros) and returns: +1 on even rows, -1 on odd rows, per token."""
    batch = ppo_batch(num_samples, seed)
    mask = batch.batch["response_mask"].float()
    sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(num_samples)])
    batch.batch["values"] = torch.zeros(num_samples, RESPONSE)
    batch.batch["returns"] = sign[:, None] * mask
    return batch
