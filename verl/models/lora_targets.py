"""The start-up check of LoRA targets: the adapters injected into an empty (meta-device) copy of the model.

A ``target_modules`` that matches nothing, or a rank wider than a targeted layer, fails here, before any worker
starts, with the config key named. It lives in :mod:`verl.models` because it loads the model's Hugging Face config
(:func:`verl.models.loading.load_hf_config`); the injection itself is :func:`verl.utils.lora.add_lora_adapters`, the
one the workers run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from verl.utils.lora import KEY, add_lora_adapters

__all__ = ["check_lora_targets"]


def check_lora_targets(model_config: Any, *, key: str = KEY) -> int:
    """Start-up check of the adapters on an empty (meta-device) copy of the model: no weights are read.

    Returns:
        The number of trainable (adapter) parameters the run will have.

    Raises:
        ValueError: as :func:`add_lora_adapters`.
    """
    from transformers import AutoModelForCausalLM

    from verl.models.loading import load_hf_config

    hf_config = load_hf_config(model_config.path, model_config.trust_remote_code, model_config.override_config)
    with torch.device("meta"):
        module = AutoModelForCausalLM.from_config(hf_config)
    if getattr(model_config, "lora_adapter_path", None):
        return _count_adapter_params(model_config.lora_adapter_path)
    add_lora_adapters(module, model_config, key=key)
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def _count_adapter_params(path: str) -> int:
    """Parameters in a saved adapter's weights file (0 when it has none)."""
    from safetensors import safe_open

    weights = Path(path) / "adapter_model.safetensors"
    if not weights.is_file():
        return 0
    num_params = 0
    with safe_open(str(weights), framework="pt") as handle:
        for name in handle.keys():
            numel = 1
            for size in handle.get_slice(name).get_shape():
                numel *= size
            num_params += numel
    return num_params
