"""Helpers below every other layer of the package.

``from verl.utils import omega_conf_to_dataclass`` (and ``hf_tokenizer``, ``hf_processor``, ``normalize_token_ids``)
works as in verl; the name is looked up on first use, so that ``import verl.utils`` stays light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["hf_processor", "hf_tokenizer", "normalize_token_ids", "omega_conf_to_dataclass"]

# names served by the lazy module attribute below, and the module that defines them
_LAZY_ATTRIBUTES = {
    "omega_conf_to_dataclass": "verl.utils.config",
    "hf_tokenizer": "verl.utils.tokenizer",
    "hf_processor": "verl.utils.tokenizer",
    "normalize_token_ids": "verl.utils.tokenizer",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY_ATTRIBUTES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'verl.utils' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
