"""Helpers below every other layer of the package.

``from verl.utils import omega_conf_to_dataclass`` works as in verl; the name is looked up on first use, so that
``import verl.utils`` stays light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["omega_conf_to_dataclass"]

# names served by the lazy module attribute below, and the module that defines them
_LAZY_ATTRIBUTES = {"omega_conf_to_dataclass": "verl.utils.config"}


def __getattr__(name: str) -> Any:
    module_name = _LAZY_ATTRIBUTES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'verl.utils' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
