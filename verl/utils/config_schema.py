"""The machinery under the typed config: one base class, one builder, one validator per rule.

The YAML files hold every default; the dataclasses of this package are their schema. A config dataclass declares
its fields with types and no defaults, and checks its value rules in ``__post_init__`` with the validators below.
:func:`build_config` turns a plain mapping (the composed, resolved YAML) into such a dataclass: it refuses a missing
key, an unknown key, and a value of the wrong type, and it names the full key (``actor_rollout_ref.actor.optim.lr``)
in every message, so a mistake fails at start-up with the key and the fix, not inside a Ray worker later.

Field types understood by the type check: ``int`` (never a bool), ``float`` (an int is accepted and converted),
``bool``, ``str``, ``Literal[...]`` (the accepted values), ``list[T]``, ``X | None``, ``Any`` (checked by the
owning class), and nested config dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeVar

T = TypeVar("T", bound="BaseConfig")

# verl keys for features this project does not have: naming one is an error that says so, never silently ignored.
# A verl switch of a feature we lack whose off value verl scripts set is a key of its own instead, refused only when on
# (see refuse_unavailable).
UNSUPPORTED_VERL_KEYS: dict[str, str] = {}


# Keys this project once had (or verl spells differently) and where they live now.
RENAMED_KEYS: dict[str, str] = {
    "critic.warmup_steps": "trainer.critic_warmup",
    "actor_rollout_ref.actor.log_prob_micro_batch_size_per_gpu": (
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
    ),
}


def known_key_message(key: str) -> str | None:
    """What to tell a user who set ``key``: a renamed key's new name, or a verl feature we lack; None otherwise."""
    if key in RENAMED_KEYS:
        return f"{key} is now {RENAMED_KEYS[key]}; set that instead."
    for verl_key, why in UNSUPPORTED_VERL_KEYS.items():
        if key == verl_key or key.startswith(verl_key + "."):
            return f"{key} is a verl key for a feature this project does not have: {why}."
    return None


class FieldError(ValueError):
    """A bad value of one field; :func:`build_config` prefixes the field's full key."""

    def __init__(self, field: str, message: str):
        super().__init__(join_key(field, message))
        self.field = field
        self.detail = message


def join_key(key: str, message: str) -> str:
    """``"a.b"`` + ``"=3 is ..."`` -> ``"a.b=3 is ..."``; ``"must be ..."`` -> ``"a.b must be ..."``."""
    return f"{key}{message}" if message.startswith("=") else f"{key} {message}"


# ---------------------------------------------------------------------------------------------- validators


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _range_text(minimum: Any, maximum: Any, exclusive_min: bool = False) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if exclusive_min else '>='} {minimum}")
    if maximum is not None:
        parts.append(f"<= {maximum}")
    return (" " + " and ".join(parts)) if parts else ""


def check_int(obj: Any, field: str, minimum: int | None = None, maximum: int | None = None) -> None:
    """``obj.field`` must be an integer (not a bool) in ``[minimum, maximum]``; None passes (the type allows it)."""
    value = getattr(obj, field)
    if value is None:
        return
    if not is_int(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise FieldError(field, f"must be an integer{_range_text(minimum, maximum)}, got {value!r}.")


def check_number(
    obj: Any, field: str, minimum: float | None = None, maximum: float | None = None, *, exclusive_min: bool = False
) -> None:
    """``obj.field`` must be a real number in its range (``exclusive_min``: strictly above ``minimum``)."""
    value = getattr(obj, field)
    if value is None:
        return
    ok = is_number(value) and value == value  # NaN fails every bound
    if ok and minimum is not None:
        ok = value > minimum if exclusive_min else value >= minimum
    if ok and maximum is not None:
        ok = value <= maximum
    if not ok:
        raise FieldError(field, f"must be a number{_range_text(minimum, maximum, exclusive_min)}, got {value!r}.")


def refuse_unavailable(obj: Any, field: str, why: str) -> None:
    """``obj.field`` switches on a verl feature this project lacks: its off value (false) is accepted, on is refused."""
    if getattr(obj, field):
        raise FieldError(field, f"=true asks for a verl feature this project does not have: {why}. Set it to false.")


def check_one_of(obj: Any, field: str, accepted: typing.Iterable[Any], what: str = "") -> None:
    """``obj.field`` must be one of ``accepted`` (a registry's names, say)."""
    value = getattr(obj, field)
    accepted = list(accepted)
    if value not in accepted:
        extra = f" ({what})" if what else ""
        raise FieldError(field, f"={value!r} is not supported; use one of {accepted}{extra}.")


def check_int_list(obj: Any, field: str, minimum: int) -> None:
    """``obj.field`` must be a list of integers >= ``minimum`` (None passes: the caller decides what it means)."""
    value = getattr(obj, field)
    if value is None:
        return
    bad = [item for item in value if not is_int(item) or item < minimum]
    if bad:
        raise FieldError(field, f"must hold integers >= {minimum}, got {bad[0]!r} in {list(value)!r}.")


# ---------------------------------------------------------------------------------------------- types


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    """Whether a plain value (from YAML) fits the annotation ``tp``."""
    if tp is Any:
        return True
    origin = typing.get_origin(tp)
    if origin is Literal:
        # True == 1 in Python: compare kinds too, so that 1 is not accepted for true
        return any(value == arg and type(value) is type(arg) for arg in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(tp))
    if origin is list:
        return isinstance(value, list | tuple) and all(_matches(v, typing.get_args(tp)[0]) for v in value)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return is_int(value)
    if tp is float:
        return is_number(value)
    if tp is str:
        return isinstance(value, str)
    if isinstance(tp, type) and issubclass(tp, BaseConfig):
        return isinstance(value, tp)
    return isinstance(value, tp)


def _literal_values(tp: Any) -> list[Any]:
    """The accepted values of a ``Literal`` annotation (``Literal[...] | None`` too); [] for other types."""
    if typing.get_origin(tp) is Literal:
        return list(typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        literals = [v for arg in args for v in _literal_values(arg)]
        others = [arg for arg in args if typing.get_origin(arg) is not Literal and arg is not type(None)]
        if literals and not others:
            return literals + ([None] if type(None) in args else [])
    return []


def _normalise(value: Any, tp: Any) -> Any:
    """Ints become floats where a float is declared; lists stay lists."""
    if tp is float and is_int(value):
        return float(value)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and float in typing.get_args(tp) and is_int(value):
        return float(value)
    if typing.get_origin(tp) is list and isinstance(value, tuple):
        return list(value)
    if typing.get_origin(tp) is list and typing.get_args(tp)[0] is float and isinstance(value, list):
        return [float(v) if is_int(v) else v for v in value]
    return value


def _config_class_in(tp: Any) -> type[BaseConfig] | None:
    if isinstance(tp, type) and issubclass(tp, BaseConfig):
        return tp
    return None


# ---------------------------------------------------------------------------------------------- base class


@dataclasses.dataclass(frozen=True)
class BaseConfig:
    """Base of every config section: type-checked fields, then the section's own rules (:meth:`check`).

    Subclasses are frozen dataclasses without defaults (the YAML holds them) that override :meth:`check` and use
    the module's validators there. ``KEY`` is the section's full key in the composed config, used in messages.
    """

    KEY: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            tp = hints[field.name]
            normalised = _normalise(value, tp)
            if normalised is not value:
                object.__setattr__(self, field.name, normalised)
            if not _matches(normalised, tp):
                if _literal_values(tp):
                    accepted = ", ".join(repr(v) for v in _literal_values(tp))
                    raise FieldError(field.name, f"={value!r} is not supported; use one of {accepted}.")
                raise FieldError(field.name, f"={value!r} has the wrong type: expected {_type_name(tp)}.")
        self.check()

    def check(self) -> None:
        """The section's value rules (ranges, accepted names); raise :class:`FieldError`."""

    @classmethod
    def from_shorthand(cls, value: Any, key: str) -> Any:
        """The mapping a section's shorter spelling stands for (a bare name, say); any other value unchanged.

        :func:`build_config` asks this before it reads the section, so a section that once was a plain value
        (``policy_loss: vanilla``) keeps accepting it. ``key`` is the section's full key, for messages.
        """
        return value

    def replace(self: T, **changes: Any) -> T:
        """A copy with ``changes`` applied, validated again."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The section as plain Python values (nested sections as dicts)."""
        return dataclasses.asdict(self)


def full_key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def nearest_keys(name: str, known: Sequence[str], count: int = 3) -> list[str]:
    """The entries of ``known`` spelled most like ``name`` (``lrr`` -> ``lr``), best first; none when nothing is
    close (difflib's ratio under 0.6)."""
    return difflib.get_close_matches(name, list(known), n=count, cutoff=0.6)


def did_you_mean(candidates: Sequence[str]) -> str:
    """`` Did you mean a or b?`` for a message's end; empty without candidates."""
    if not candidates:
        return ""
    return " Did you mean " + " or ".join(f"{c}" for c in candidates) + "?"


def _unknown_key_message(key: str, known: list[str]) -> str:
    parent, _, name = key.rpartition(".")
    close = [full_key(parent, other) for other in nearest_keys(name, known)]
    return known_key_message(key) or (
        f"{key} is not a known config key.{did_you_mean(close)} The keys here are {known}; see docs/config."
    )


def build_config(cls: type[T], values: Mapping[str, Any], prefix: str | None = None) -> T:
    """Build ``cls`` from a plain mapping, with the full key of every problem in the message.

    Args:
        cls: a :class:`BaseConfig` subclass.
        values: the section's values (a resolved, plain mapping; nested sections as mappings).
        prefix: the section's full key (defaults to ``cls.KEY``).

    Raises:
        ValueError: a missing key, an unknown key, a value of the wrong type or outside its rule.
    """
    prefix = cls.KEY if prefix is None else prefix
    values = cls.from_shorthand(values, prefix)
    if not isinstance(values, Mapping):
        raise ValueError(f"{prefix or 'the config'} must be a mapping of keys, got {values!r}.")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in names:
            raise ValueError(_unknown_key_message(full_key(prefix, str(key)), names))
    kwargs: dict[str, Any] = {}
    for name in names:
        key = full_key(prefix, name)
        if name not in values:
            raise ValueError(f"{key} is missing; every key has its default in the YAML config (see docs/config).")
        value = values[name]
        nested = _config_class_in(hints[name])
        if nested is not None:
            value = build_config(nested, value, key)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except FieldError as err:
        raise ValueError(join_key(full_key(prefix, err.field), err.detail)) from None
