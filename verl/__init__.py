"""verl: reinforcement-learning post-training for language models, with fp16 training that survives overflow.

``from verl import DataProto`` works as in the open-source verl project. The protocol module (and with it torch
and tensordict) is imported on first access to those names rather than at ``import verl``, so light entry points
(config tools, ``--help``) stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["DataProto", "DataProtoItem", "__version__"]

if TYPE_CHECKING:
    from verl.protocol import DataProto, DataProtoItem

# names served by the lazy module attribute below, and the module that defines them
_LAZY_ATTRIBUTES = {"DataProto": "verl.protocol", "DataProtoItem": "verl.protocol"}


def __getattr__(name: str) -> Any:
    module_name = _LAZY_ATTRIBUTES.get(name)
    if module_name is None:
        raise AttributeError(f"module 'verl' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_ATTRIBUTES))
