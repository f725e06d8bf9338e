"""Reading config values the same way everywhere: from an OmegaConf DictConfig, a plain dict, or an object."""

from __future__ import annotations

from typing import Any


def cfg_get(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]`` for mappings (DictConfig, dict), ``config.key`` for other objects; ``default`` if absent."""
    if config is None:
        return default
    if hasattr(config, "get"):
        return config.get(key, default)
    return getattr(config, key, default)
