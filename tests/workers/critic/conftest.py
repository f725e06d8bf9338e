"""Shared helpers for the critic tests: a critic config and a PPO batch carrying old values and returns."""

import torch
from omegaconf import OmegaConf

from tests.workers.actor.conftest import RESPONSE, ppo_batch


def critic_config(**overrides):
    base = {
        "strategy": "dp",
        "dtype": "float32",
        "ppo_mini_batch_size": 8,
        "ppo_micro_batch_size_per_gpu": 4,
        "forward_micro_batch_size_per_gpu": 8,
        "ppo_epochs": 1,
        "shuffle": False,
        "cliprange_value": 0.5,
        "loss_agg_mode": "token-mean",
        "update_failure_policy": "auto",
        "fault_injection": {"nonfinite_grad_steps": [], "ranks": None},
        "optim": {
            "lr": 3e-3,
            "betas": [0.9, 0.999],
            "weight_decay": 0.0,
            "clip_grad": 1.0,
            "lr_warmup_steps": 0,
            "lr_scheduler": "constant",
            "min_lr_ratio": 0.0,
            "initial_loss_scale": 2.0**32,
            "min_loss_scale": 1.0,
            "loss_scale_window": 1000,
            "hysteresis": 2,
        },
        "megatron": {
            "tensor_model_parallel_size": 1,
            "pipeline_model_parallel_size": 1,
            "use_megatron_optimizer": "auto",
        },
        "seed": 1,
    }
    return OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(overrides))


def value_batch(num_samples=8, seed=0):
    """The actor tests' batch plus old values (zeros) and returns: +1 on even rows, -1 on odd rows, per token."""
    batch = ppo_batch(num_samples, seed)
    mask = batch.batch["response_mask"].float()
    sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(num_samples)])
    batch.batch["values"] = torch.zeros(num_samples, RESPONSE)
    batch.batch["returns"] = sign[:, None] * mask
    return batch
