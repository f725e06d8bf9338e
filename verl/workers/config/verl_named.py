"""The machinery of verl's config class names: keyword construction over the YAML defaults, mapping access.

verl's config classes (``ActorConfig(strategy="fsdp", optim=OptimizerConfig(lr=0.1), rollout_n=1)``) carry their
defaults in the dataclass. This package keeps one source of defaults, the YAML under ``verl/trainer/config``; its
section dataclasses have none. A verl-named class here is a subclass of the section it stands for (so it is that
section wherever this package takes one) installed by :func:`verl_named`:

* its constructor takes any subset of the section's keys: each missing key takes its value from the YAML (verl's
  defaults as this package composes them, without the embedded tiny-model layer), a nested section given as a
  mapping is laid over the nested defaults (a ``_target_`` key in it picks the verl-named class to build), and
  the result is validated exactly as the same keys in the YAML would be;
* ``_target_`` is accepted and ignored (the class is already known), so verl's configs round-trip;
* a few attributes verl keeps on these classes without a key of this package's section (``rollout_n``...) are
  plain attributes with their value from the YAML key verl derives them from, or None;
* an instance reads like a mapping (``cfg["lr"]``, ``cfg.get``, ``list(cfg)``, ``len(cfg)``, ``in``) and counts as
  a :class:`verl.base_config.BaseConfig`;
* fields stay fixed except those verl lets its workers assign (its ``_mutable_fields``: batch sizes, mostly). This
  package's own code never assigns them; it works from the sections the YAML builds, which are fully frozen.

``from_verl_mapping`` is what :func:`verl.utils.config.omega_conf_to_dataclass` calls to build one of them.
"""

from __future__ import annotations

import abc
import collections.abc
import copy
import dataclasses
import functools
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from omegaconf import OmegaConf

from verl.base_config import BaseConfig as VerlBaseConfig
from verl.utils.config import TARGET_KEY, locate
from verl.workers.config.schema import BaseConfig, FieldError, build_config, full_key, join_key, known_key_message

__all__ = ["VerlNamedConfig", "section_defaults", "verl_named"]

# an extra attribute whose value is read from this YAML key when not given
YamlKey = str


@functools.cache
def _composed_defaults(config_name: str) -> dict[str, Any]:
    """``config_name``'s defaults, resolved, without the embedded tiny-model layer: verl's defaults as composed here."""
    from verl.workers.config.composition import EMBEDDED_LAYER_SLOT, compose_omegaconf

    try:
        composed = compose_omegaconf([f"~{EMBEDDED_LAYER_SLOT}"], config_name)
    except ValueError:  # a config file without the embedded slot
        composed = compose_omegaconf([], config_name)
    return OmegaConf.to_container(composed, resolve=True)


def section_defaults(key: str, config_name: str = "ppo_trainer") -> Any:
    """A fresh copy of the default value at ``key`` (``actor_rollout_ref.actor.optim``) of ``config_name``."""
    value: Any = _composed_defaults(config_name)
    for part in key.split("."):
        value = value[part]
    return copy.deepcopy(value)


def _merged(defaults: Any, given: Any) -> Any:
    """``given`` laid over ``defaults``: mappings merge key by key, anything else replaces."""
    if isinstance(defaults, Mapping) and isinstance(given, Mapping):
        merged = dict(defaults)
        for name, value in given.items():
            merged[name] = _merged(defaults.get(name), value)
        return merged
    return given


def _config_class(hint: Any) -> type[BaseConfig] | None:
    return hint if isinstance(hint, type) and issubclass(hint, BaseConfig) else None


# the verl-named class that stands for a section class (the first one named for it: ``OptimizerConfig`` for
# ``OptimConfig``), which a nested section of a verl-named class is built as
_VERL_CLASS_OF_SECTION: dict[type, type] = {}


def _nested(hint: type[BaseConfig], defaults: Any, given: Mapping[str, Any], key: str) -> BaseConfig:
    """A nested section given as a mapping: over its defaults, as the class its ``_target_`` names (else the
    verl-named class of ``hint``, else ``hint``)."""
    values = dict(given)
    target = values.pop(TARGET_KEY, None)
    cls = locate(target) if target else _VERL_CLASS_OF_SECTION.get(hint, hint)
    if not (isinstance(cls, type) and issubclass(cls, hint)):
        raise ValueError(f"{key}.{TARGET_KEY}={target!r} is not a {hint.__name__}; name one of its classes.")
    if issubclass(cls, VerlNamedConfig):  # the keys given stay the given ones (verl_normalise tells them apart)
        built = cls.__new__(cls)
        built._verl_setup(values, defaults if isinstance(defaults, Mapping) else {}, key)
        return built
    return build_config(cls, _merged(defaults, values), key)


def _unknown(cls: type, names: list[str]) -> None:
    """Refuse keyword arguments that are neither keys of the section nor verl attributes this class keeps."""
    if not names:
        return
    key = full_key(cls.VERL_SECTION, names[0])
    known = [f.name for f in dataclasses.fields(cls)] + list(cls.VERL_EXTRAS)
    raise TypeError(
        known_key_message(key)
        or f"{cls.__name__} got {names[0]!r}, which is not a key of {cls.VERL_SECTION} here; its keys are "
        f"{sorted(known)}."
    )


def _dataclass_init(cls: type) -> Callable[..., None]:
    """The generated ``__init__`` of the section ``cls`` stands for."""
    for base in cls.__mro__[1:]:
        if "__dataclass_fields__" in base.__dict__ and "__init__" in base.__dict__:
            return base.__dict__["__init__"]
    raise TypeError(f"{cls.__name__} stands for no config section.")


# strategies one backend serves under two names
_STRATEGY_FAMILY = {"fsdp2": "fsdp"}


class VerlNamedMeta(abc.ABCMeta):
    """Counts a section built from the YAML (an instance of the very section class a verl-named class stands for)
    as an instance of that verl-named class, so ``isinstance(config.actor_rollout_ref.actor, ActorConfig)`` holds;
    a variant class counts it only when it fixes ``strategy`` (``FSDPActorConfig``) and the section has that
    backend. Such a section has no mapping access or verl attributes (``rollout_n``): only a verl-named class has."""

    def __instancecheck__(cls, obj: Any) -> bool:
        if super().__instancecheck__(obj):
            return True
        section = next((base for base in cls.__mro__ if "__dataclass_fields__" in base.__dict__), None)
        if section is None or type(obj) is not section:
            return False
        strategy = cls.VERL_FIXED.get("strategy")
        if strategy is None:
            return section in cls.__bases__  # the class standing for the section itself, not a variant of it
        family = _STRATEGY_FAMILY.get(strategy, strategy)
        return _STRATEGY_FAMILY.get(obj.strategy, obj.strategy) == family


class VerlNamedConfig(collections.abc.Mapping, metaclass=VerlNamedMeta):
    """The mapping view and the hooks of a verl-named class; see the module docstring.

    Subclasses list it after the section they stand for. Class attributes (set through :func:`verl_named`):
    ``VERL_SECTION`` the section's full key; ``VERL_DEFAULTS_FROM`` the config file whose defaults fill missing
    keys; ``VERL_FIXED`` keys whose value the class itself decides when not given (``strategy`` of the FSDP and
    megatron classes, and verl's class defaults where verl's own YAML gives another value); ``VERL_EXTRAS`` verl
    attributes without a key here (name -> YAML key to read, or None); ``VERL_MUTABLE`` assignable fields.
    """

    VERL_SECTION: typing.ClassVar[str] = ""
    VERL_DEFAULTS_FROM: typing.ClassVar[str] = "ppo_trainer"
    VERL_FIXED: typing.ClassVar[Mapping[str, Any]] = {}
    VERL_EXTRAS: typing.ClassVar[Mapping[str, YamlKey | None]] = {}
    VERL_MUTABLE: typing.ClassVar[frozenset[str]] = frozenset()

    def _verl_init(self, **given: Any) -> None:
        cls = type(self)
        # the YAML is composed only when something is left to fill (a full set of keys is what build_config gives)
        missing = any(f.name not in given for f in dataclasses.fields(cls))
        defaults = {**section_defaults(cls.VERL_SECTION, cls.VERL_DEFAULTS_FROM), **cls.VERL_FIXED} if missing else {}
        self._verl_setup(given, defaults, cls.VERL_SECTION)

    def _verl_setup(self, given: Mapping[str, Any], defaults: Mapping[str, Any], key: str) -> None:
        """Set the fields from the keys ``given``, the rest from ``defaults``; ``key`` is the section's full key."""
        cls = type(self)
        given = {name: value for name, value in given.items() if name != TARGET_KEY}
        extras = {name: given.pop(name, _EXTRA_DEFAULT) for name in cls.VERL_EXTRAS}
        names = [f.name for f in dataclasses.fields(cls)]
        _unknown(cls, [name for name in given if name not in names])
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for name in names:
            if name not in given and name not in defaults:
                raise ValueError(f"{full_key(key, name)} has no default in the YAML config; give it.")
            nested = _config_class(hints[name])
            value = given.get(name, defaults.get(name))
            if nested is not None and isinstance(value, Mapping):
                value = _nested(nested, defaults.get(name, {}), value, full_key(key, name))
            values[name] = value
        for name, yaml_key in cls.VERL_EXTRAS.items():
            if extras[name] is _EXTRA_DEFAULT:
                extras[name] = None if yaml_key is None else section_defaults(yaml_key, cls.VERL_DEFAULTS_FROM)
        cls.verl_normalise(values, set(given))
        cls.verl_check(values, extras)
        try:
            _dataclass_init(cls)(self, **values)
        except FieldError as err:
            raise ValueError(join_key(full_key(key, err.field), err.detail)) from None
        for name, value in extras.items():
            object.__setattr__(self, name, value)

    @classmethod
    def verl_normalise(cls, values: dict[str, Any], given: set[str]) -> None:
        """Fill values verl derives from others (``given``: the keys the caller set); changes ``values`` in place."""

    @classmethod
    def verl_check(cls, values: dict[str, Any], extras: dict[str, Any]) -> None:
        """verl's own rules for these keys, with verl's messages, before this package's checks."""

    @classmethod
    def from_verl_mapping(cls, values: Mapping[str, Any]) -> Any:
        """An instance from a mapping of keys (what ``omega_conf_to_dataclass`` hands over)."""
        return cls(**{str(name): value for name, value in values.items()})

    def _verl_setattr(self, name: str, value: Any) -> None:
        if name in type(self).VERL_MUTABLE or name not in self.__dict__:
            object.__setattr__(self, name, value)
            return
        raise dataclasses.FrozenInstanceError(
            f"{type(self).__name__}.{name} cannot be assigned; of its fields only {sorted(type(self).VERL_MUTABLE)} "
            "can (as in verl)."
        )

    def _keys(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)] + list(type(self).VERL_EXTRAS)

    def __getitem__(self, key: str) -> Any:
        if not isinstance(key, str):
            raise TypeError(f"config keys are attribute names (str), got {type(key).__name__}.")
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def __contains__(self, key: object) -> bool:
        return key in self._keys()


_EXTRA_DEFAULT = object()


def verl_named(
    *,
    section: str | None = None,
    defaults_from: str = "ppo_trainer",
    fixed: Mapping[str, Any] | None = None,
    extras: Mapping[str, YamlKey | None] | None = None,
    mutable: tuple[str, ...] = (),
) -> Callable[[type], type]:
    """Class decorator: make ``cls`` (``class X(Section, VerlNamedConfig)``) a verl-named class of its section.

    ``section`` is the section's full key (default: the class's ``KEY``, else its parent's ``VERL_SECTION``).
    """

    def install(cls: type) -> type:
        cls.VERL_SECTION = section or cls.KEY or cls.VERL_SECTION
        cls.VERL_DEFAULTS_FROM = defaults_from
        cls.VERL_FIXED = {**getattr(cls, "VERL_FIXED", {}), **(fixed or {})}
        cls.VERL_EXTRAS = {**getattr(cls, "VERL_EXTRAS", {}), **(extras or {})}
        cls.VERL_MUTABLE = frozenset(getattr(cls, "VERL_MUTABLE", frozenset())) | frozenset(mutable)
        cls.__init__ = VerlNamedConfig._verl_init
        cls.__setattr__ = VerlNamedConfig._verl_setattr
        VerlBaseConfig.register(cls)
        stands_for = next(base for base in cls.__mro__ if "__dataclass_fields__" in base.__dict__)
        _VERL_CLASS_OF_SECTION.setdefault(stands_for, cls)
        return cls

    return install
