"""The one registry helper behind every pluggable piece of verl.

Update-outcome handlers, policy losses, advantage estimators, reward managers and rollouts are all looked up by
name in a :class:`Registry`. Keeping one implementation means one duplicate rule (registering the same object
twice is a no-op, a different object under a taken name is a ``ValueError``) and one error shape (an unknown name
is a ``ValueError`` reading ``Unknown <kind>: <name>`` that lists the registered ones). Registries are per process:
code that registers must be imported in every process that looks the name up, which is why configs can name a
``module`` to import first. A registry also answers the dict operations verl's registries (plain dicts) offer:
``name in r``, ``r[name]``, ``r[name] = obj``, ``del r[name]``, ``len``, ``keys``/``values``/``items``,
``update`` and ``clear``; every write goes through the duplicate rule. A registry may name the module that holds
its built-in entries (``builtins``): it is imported on first use, so a registry can live below both the config that
validates a name and the implementations that register under it, and still know the built-in names.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# marks "no default given" in Registry.get, where None is a valid default
_MISSING: Any = object()


def _qualified_name(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


class Registry(Generic[T]):
    """A name -> object table with a decorator for registration.

    Args:
        kind: what the registry holds, in words ("update-outcome handler"); used in error messages.
        config_key: the config key users set to choose an entry, named in lookup errors (optional).
        builtins: the importable module that registers the built-in entries (optional). It is imported before the
            registry is first read or written, by name: the registry's module never imports its implementations.
    """

    def __init__(self, kind: str, config_key: str | None = None, builtins: str | None = None):
        self.kind = kind
        self.config_key = config_key
        self.builtins = builtins
        self._builtins_loaded = builtins is None
        self._store: dict[str, T] = {}

    @property
    def _entries(self) -> dict[str, T]:
        """The name -> object table, with the built-ins registered first."""
        if not self._builtins_loaded:
            # set before the import: the built-in module registers through add(), which reads this table again
            self._builtins_loaded = True
            try:
                importlib.import_module(self.builtins)
            except BaseException:
                self._builtins_loaded = False
                raise
        return self._store

    def add(self, name: str, obj: T) -> T:
        """Register ``obj`` under ``name`` and return it.

        Registering the same object again (or a re-import of it: same module and qualified name) is a no-op, so
        modules that register at import time can be imported more than once.

        Raises:
            ValueError: ``name`` is empty or already holds a different object.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"A {self.kind} must be registered under a non-empty string name, got {name!r}.")
        current = self._entries.get(name, _MISSING)
        if current is not _MISSING and current is not obj:
            if _qualified_name(current) != _qualified_name(obj):
                raise ValueError(
                    f"Cannot register {_qualified_name(obj)} as {self.kind} {name!r}: the name is taken by "
                    f"{_qualified_name(current)}. Pick another name."
                )
        self._entries[name] = obj
        return obj

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add`: ``@registry.register("name")``."""

        def decorator(obj: T) -> T:
            return self.add(name, obj)

        return decorator

    def get(self, name: str, default: Any = _MISSING) -> T:
        """Look ``name`` up; with ``default`` given, return it for an unknown name instead of raising.

        Raises:
            ValueError: the name is not registered and no ``default`` was given; the message reads
                ``Unknown <kind>: <name>`` and lists the registered names.
        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            if default is not _MISSING:
                return default
            where = f" (config key `{self.config_key}`)" if self.config_key else ""
            raise ValueError(
                f"Unknown {self.kind}: {name}{where}. Registered: {', '.join(self.names()) or '(none)'}. "
                f"Use one of these names, or register yours before it is looked up."
            ) from None

    @contextlib.contextmanager
    def scoped(self) -> Iterator[Registry[T]]:
        """Registrations made inside the block are undone when it ends (tests, notebooks trying a handler).

        Example::

            with UPDATE_OUTCOME_HANDLER_REGISTRY.scoped():
                importlib.import_module("my.handlers")  # registers "mine" until the block ends
        """
        saved = dict(self._entries)
        try:
            yield self
        finally:
            self._entries.clear()
            self._entries.update(saved)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    # ------------------------------------------------------------------ dict operations (verl's registries are dicts)

    def update(self, entries: Mapping[str, T] | Iterable[tuple[str, T]] = (), /, **kwargs: T) -> None:
        """Register every ``name: obj`` pair, each through :meth:`add` (so the duplicate rule applies)."""
        pairs = entries.items() if isinstance(entries, Mapping) else entries
        for name, obj in [*pairs, *kwargs.items()]:
            self.add(name, obj)

    def clear(self) -> None:
        """Forget every registration, the built-in ones included; :meth:`scoped` is the way to undo only yours."""
        self._entries.clear()

    def keys(self) -> list[str]:
        """The registered names, sorted (as :meth:`names`)."""
        return self.names()

    def values(self) -> list[T]:
        """The registered objects, in the order of :meth:`names`."""
        return [self._entries[name] for name in self.names()]

    def items(self) -> list[tuple[str, T]]:
        """``(name, object)`` pairs, in the order of :meth:`names`."""
        return [(name, self._entries[name]) for name in self.names()]

    def __getitem__(self, name: str) -> T:
        """``registry[name]`` is :meth:`get` without a default (an unknown name is the same ``ValueError``)."""
        return self.get(name)

    def __setitem__(self, name: str, obj: T) -> None:
        self.add(name, obj)

    def __delitem__(self, name: str) -> None:
        self.get(name)  # the one error shape for an unknown name
        del self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
