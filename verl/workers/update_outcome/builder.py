"""From the ``update_failure_policy`` config value to a ready handler.

The value is a name (``strict``, ``fp16_warn_and_count``, ``auto``, any registered name, or ``"pkg.mod:Class"``)
or a mapping ``{name: ..., module: ..., <handler params>}``. ``module`` is imported first, in whichever process
builds the handler, so that a handler registered by user code is found in every Ray worker. Every mistake fails
here, at start-up, with a message that says what is accepted.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

import torch

from verl.workers.update_outcome.base import (
    UpdateOutcomeHandler,
    get_update_outcome_handler_cls,
    list_update_outcome_handlers,
)
from verl.workers.update_outcome.outcome import policy_config_key

AUTO = "auto"


DTYPE_NAMES = ("float16", "bfloat16", "float32")


def is_fp16(dtype: str | torch.dtype | None) -> bool:
    """True when ``dtype`` is float16: ``torch.float16`` or its config spelling ``"float16"`` (the only one).

    Raises:
        ValueError: a string that is not one of the config's dtype names (``"fp16"`` would otherwise quietly mean
            "not fp16" and pick ``strict``).
    """
    if isinstance(dtype, torch.dtype):
        return dtype == torch.float16
    if dtype is not None and dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype={dtype!r} is not a dtype name the config accepts; use one of {list(DTYPE_NAMES)}.")
    return dtype == "float16"


def resolve_policy_name(name: str, dtype: str | torch.dtype | None) -> str:
    """``auto`` -> ``fp16_warn_and_count`` for fp16 training, ``strict`` otherwise; other names unchanged."""
    if name == AUTO:
        return "fp16_warn_and_count" if is_fp16(dtype) else "strict"
    return name


def _import_module(module: Any, where: str) -> None:
    """Import ``module``; ``where`` is the setting that named it, as the user wrote it (for the message)."""
    if not isinstance(module, str) or not module:
        raise ValueError(f"{where} must be an importable module path (a string), got {module!r}.")
    try:
        importlib.import_module(module)
    except Exception as err:  # any import-time failure is a config error to report, not to hide
        raise ValueError(
            f"{where}: module {module!r} could not be imported ({type(err).__name__}: {err}). Make sure the module "
            f"is on PYTHONPATH in every process (driver and Ray workers)."
        ) from err


# the keys of the mapping form: a value that starts with one of them and a colon is that mapping without its braces
_MAPPING_KEYS = ("name", "module")


def _braces_forgotten(path: str, key: str) -> str | None:
    """The message for a mapping written without its braces (``name: x``, ``name: x, module: m``), which reads as a
    class path whose module is ``name``; None for anything else. A class path has no spaces or commas."""
    module_name = path.partition(":")[0].strip()
    if module_name not in _MAPPING_KEYS and not any(c.isspace() or c == "," for c in path):
        return None
    items = [item.partition(":") for item in path.split(",")]
    mapping = "{" + ", ".join(f"{k.strip()}: {v.strip()}" for k, _, v in items) + "}"
    return (
        f"{key}={path!r} reads as a mapping written without its braces. Write the mapping in braces, quoted for the "
        f"shell: '{key}={mapping}'; a class path looks like 'package.module:ClassName' (no spaces)."
    )


def _load_class_path(path: str, key: str) -> type[UpdateOutcomeHandler]:
    forgotten = _braces_forgotten(path, key)
    if forgotten is not None:
        raise ValueError(forgotten)
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{key}={path!r}: a class path must look like 'package.module:ClassName'.")
    _import_module(module_name, f"{key}={path!r}")
    cls = getattr(importlib.import_module(module_name), attr, None)
    if cls is None:
        raise ValueError(f"{key}={path!r}: module {module_name!r} has no attribute {attr!r}.")
    if not (isinstance(cls, type) and issubclass(cls, UpdateOutcomeHandler)):
        raise ValueError(f"{key}={path!r} is {cls!r}, which is not an UpdateOutcomeHandler subclass.")
    return cls


def _accepted_params(cls: type[UpdateOutcomeHandler]) -> tuple[list[str], bool]:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params)
    return names, takes_any


def _split_policy(policy: Any, key: str) -> tuple[str, dict[str, Any]]:
    """(name, params) from the config value, importing ``module`` when the mapping names one."""
    if policy is None:
        return AUTO, {}
    if isinstance(policy, str):
        return policy, {}
    try:  # OmegaConf DictConfig -> plain dict, without importing omegaconf for plain mappings
        from omegaconf import DictConfig, OmegaConf

        if isinstance(policy, DictConfig):
            policy = OmegaConf.to_container(policy, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        pass
    if not isinstance(policy, Mapping):
        raise ValueError(
            f"{key} must be a handler name or a mapping {{name: ..., module: ..., <params>}}, got "
            f"{type(policy).__name__} {policy!r}."
        )
    params = dict(policy)
    if "name" not in params:
        raise ValueError(f"{key} is a mapping without 'name'; add name: <handler> (got keys {sorted(params)}).")
    name = params.pop("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{key}.name must be a non-empty string, got {name!r}.")
    module = params.pop("module", None)
    if module is not None:
        _import_module(module, f"{key}.module={module!r}")
    return name, params


def build_update_outcome_handler(
    policy: str | Mapping[str, Any] | None, *, dtype: str | torch.dtype | None, role: str = "actor"
) -> UpdateOutcomeHandler:
    """Build the handler the config asks for.

    Args:
        policy: the ``update_failure_policy`` value: a name, ``"pkg.mod:Class"``, a mapping
            ``{name, module?, **params}``, or None (same as ``auto``).
        dtype: the model's training dtype; decides what ``auto`` means.
        role: the model the handler serves ("actor", "critic"), used to name the config key in errors.

    Raises:
        ValueError: unknown name or parameter, invalid parameter value, module that does not import, a class
            that is not an :class:`UpdateOutcomeHandler`.
    """
    key = policy_config_key(role)
    name, params = _split_policy(policy, key)
    name = resolve_policy_name(name, dtype)
    if ":" in name:
        cls = _load_class_path(name, key)
    else:
        if name not in list_update_outcome_handlers():
            raise ValueError(
                f"{key}: unknown update-outcome handler {name!r}. Registered: {list_update_outcome_handlers()}, or "
                f"'{AUTO}' (fp16 -> fp16_warn_and_count, else strict), or 'package.module:ClassName'. A handler "
                f"registered by your own code needs {{name: ..., module: your.module}} so every worker imports it."
            )
        cls = get_update_outcome_handler_cls(name)
    accepted, takes_any = _accepted_params(cls)
    unknown = sorted(set(params) - set(accepted))
    if unknown and not takes_any:
        raise ValueError(
            f"{key}: handler {name!r} does not take parameter(s) {unknown}; accepted: {accepted or '(none)'}."
        )
    try:
        return cls(**params)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{key}: handler {name!r} rejected its parameters {params}: {err}") from err
