"""verl's ``BaseConfig`` for user code: a dataclass that reads like a mapping and keeps its fields fixed.

Code written against verl declares its own config dataclasses on this base (``@dataclass class MyConfig(BaseConfig)``)
and builds them with :func:`verl.utils.config.omega_conf_to_dataclass`. An instance answers ``cfg["name"]``,
``cfg.get("name", default)``, ``len(cfg)``, ``list(cfg)`` (its field names) and ``"name" in cfg``. A field, once set,
cannot be assigned again unless the class names it in ``_mutable_fields``; attributes that are not fields may be
added freely, as in verl.

The typed sections of this package (:mod:`verl.workers.config`) are frozen dataclasses of their own, built from the
YAML; their verl-named classes (``ActorConfig``, ``FSDPOptimizerConfig``...) count as instances of this base too.
"""

from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, ClassVar

__all__ = ["BaseConfig"]


@dataclasses.dataclass
class BaseConfig(collections.abc.Mapping):
    """A dataclass with a read-only mapping view of its fields.

    Attributes:
        _target_: the dotted name of the class, as Hydra's ``instantiate`` reads it ("" when unused).
    """

    _mutable_fields: ClassVar[set[str]] = set()
    _target_: str = ""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__ and name not in type(self)._mutable_fields:
            raise dataclasses.FrozenInstanceError(
                f"{type(self).__name__}.{name} is fixed once set; only {sorted(type(self)._mutable_fields)} may change."
            )
        super().__setattr__(name, value)

    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str):
            raise TypeError(f"config keys are attribute names (str), got {type(key).__name__}.")
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in {f.name for f in dataclasses.fields(self)}

    def __iter__(self):
        return iter([f.name for f in dataclasses.fields(self)])

    def __len__(self) -> int:
        return len(dataclasses.fields(self))
