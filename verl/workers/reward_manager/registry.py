"""The reward-manager registry and the loader for user-supplied scoring functions.

A reward manager turns a batch of generated responses into ``token_level_scores``; which one runs is the config
key ``reward_model.reward_manager``. Users add their own with ``@register_reward_manager("name")`` in a module
their config imports. A custom scorer is named by a ``"module.path:function"`` string (or ``"path/to/file.py:fn"``)
and is imported like any training script: it is trusted code.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

from verl.utils.registry import Registry

REWARD_MANAGER_REGISTRY: Registry[type] = Registry("reward manager", config_key="reward_model.reward_manager")


def register_reward_manager(name: str) -> Callable[[type], type]:
    """Class decorator registering a reward manager under ``name`` (same class twice is a no-op)."""
    return REWARD_MANAGER_REGISTRY.register(name)


def get_reward_manager_cls(name: str) -> type:
    """The reward manager class registered as ``name``.

    Raises:
        ValueError: unknown name; the message lists the registered ones.
    """
    return REWARD_MANAGER_REGISTRY.get(name)


def list_reward_managers() -> list[str]:
    """Registered reward manager names, sorted."""
    return REWARD_MANAGER_REGISTRY.names()


def _import_source(source: str, spec: str):
    if source.endswith(".py"):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"Custom reward function {spec!r}: file {source!r} does not exist.")
        module_spec = importlib.util.spec_from_file_location(f"verl_custom_reward_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module
    return importlib.import_module(source)


def load_custom_score_fn(spec: str) -> Callable[..., float]:
    """Import a scoring function named ``"module.path:function"`` or ``"path/to/file.py:function"``.

    The function is called like the default dispatch:
    ``fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...) -> float``.

    Raises:
        ValueError: the string is not ``source:function``, the import fails, the attribute is missing, or it is
            not callable; each message says how to fix it.
    """
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(part.strip() for part in spec.split(":")):
        raise ValueError(
            f"Custom reward function must be given as 'module.path:function' or 'path/to/file.py:function', "
            f"got {spec!r}."
        )
    source, function_name = (part.strip() for part in spec.split(":"))
    try:
        module = _import_source(source, spec)
    except ValueError:
        raise
    except Exception as err:
        raise ValueError(
            f"Custom reward function {spec!r}: importing {source!r} failed ({type(err).__name__}: {err}). "
            "Make sure the module is importable (on PYTHONPATH in every worker process) and imports cleanly."
        ) from err
    if not hasattr(module, function_name):
        raise ValueError(f"Custom reward function {spec!r}: {source!r} has no attribute {function_name!r}.")
    function = getattr(module, function_name)
    if not callable(function):
        raise ValueError(
            f"Custom reward function {spec!r}: {function_name!r} is a {type(function).__name__}, not a function. "
            "Point at a function (data_source, solution_str, ground_truth, extra_info=None) -> float."
        )
    return function
