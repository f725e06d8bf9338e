"""``omega_conf_to_dataclass``: a config mapping (OmegaConf or plain) turned into a config dataclass, as in verl.

Two ways to name the class, as verl has them: the ``dataclass_type`` argument, or a ``_target_`` key holding the
class's dotted name (``verl.workers.config.FSDPActorConfig``). What happens next depends on the class:

* a class that provides ``from_verl_mapping`` (every verl-named section of :mod:`verl.workers.config`) builds itself:
  the keys given are laid over this package's YAML defaults of that section, nested ``_target_`` keys included, and
  the result is validated like any section of the YAML (``_target_`` itself is only a marker there);
* any other dataclass (typically user code on :class:`verl.base_config.BaseConfig`) takes its own field defaults,
  the mapping's keys laid over them, through OmegaConf's structured configs;
* with ``_target_`` naming something that is not a dataclass, Hydra's ``instantiate`` builds it.

This module sits in the bottom layer: it looks the class up by name and never imports the sections themselves.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

__all__ = ["omega_conf_to_dataclass"]

TARGET_KEY = "_target_"


def locate(dotted_name: str) -> Any:
    """The object a dotted name (``package.module.Name``) refers to.

    Raises:
        ValueError: no module of that name holds such an attribute.
    """
    module_name, _, attribute = dotted_name.rpartition(".")
    while module_name:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            module_name, _, head = module_name.rpartition(".")
            attribute = f"{head}.{attribute}"
            continue
        value: Any = module
        try:
            for part in attribute.split("."):
                value = getattr(value, part)
        except AttributeError:
            break
        return value
    raise ValueError(f"{TARGET_KEY}={dotted_name!r} names nothing importable; give the full dotted name of a class.")


def _plain(config: Any) -> Any:
    """A resolved plain-Python copy of an OmegaConf node (plain values as they are)."""
    if isinstance(config, DictConfig | ListConfig):
        return OmegaConf.to_container(config, resolve=True)
    return config


def _structured(values: dict[str, Any], dataclass_type: type) -> Any:
    """A dataclass with defaults, ``values`` laid over them with OmegaConf's type checks."""
    names = {f.name for f in dataclasses.fields(dataclass_type)}
    if TARGET_KEY not in names:
        values = {k: v for k, v in values.items() if k != TARGET_KEY}
    merged = OmegaConf.merge(OmegaConf.structured(dataclass_type), OmegaConf.create(values))
    return OmegaConf.to_object(merged)


def omega_conf_to_dataclass(config: DictConfig | Mapping | None, dataclass_type: type | None = None) -> Any:
    """``config`` as an instance of ``dataclass_type``, or of the class its ``_target_`` names.

    Args:
        config: an OmegaConf ``DictConfig`` or a plain mapping; an object that is neither is returned unchanged;
            an empty one gives ``dataclass_type()`` (None without a type).
        dataclass_type: the class to build; None reads ``_target_`` from ``config``.

    Raises:
        ValueError: no class named, a ``_target_`` that does not import, or a type that is not a dataclass; a
            verl-named section raises as its YAML would on a bad key or value.
    """
    if not config:
        return None if dataclass_type is None else dataclass_type()
    if not isinstance(config, DictConfig | ListConfig | Mapping | list):
        return config
    values = _plain(config)
    if dataclass_type is None:
        if not isinstance(values, Mapping) or TARGET_KEY not in values:
            raise ValueError(
                f"omega_conf_to_dataclass needs a dataclass_type or a {TARGET_KEY} key naming the class to build; "
                f"got the keys {sorted(values) if isinstance(values, Mapping) else values!r}."
            )
        target = locate(values[TARGET_KEY])
        if not dataclasses.is_dataclass(target):
            from hydra.utils import instantiate

            return instantiate(config, _convert_="partial")
        dataclass_type = target
    if not (isinstance(dataclass_type, type) and dataclasses.is_dataclass(dataclass_type)):
        raise ValueError(f"{dataclass_type!r} is not a dataclass type.")
    build = getattr(dataclass_type, "from_verl_mapping", None)
    if build is not None:
        return build(values)
    return _structured(dict(values), dataclass_type)
