"""Error classes shared across verl's public API.

Upstream verl checks many user inputs with ``assert``, so code written against it may catch ``AssertionError``. This
project reports bad input with a ``ValueError`` whose message says what was wrong and how to fix it (DESIGN.md
section 6). :class:`ValidationError` is both, so handlers written for either keep working; raise it wherever verl
asserts on user input.
"""

from __future__ import annotations

__all__ = ["ValidationError"]


class ValidationError(ValueError, AssertionError):
    """Bad user input, raised where upstream verl would fail an ``assert``.

    A ``ValueError`` (this project's convention for bad input) that is also an ``AssertionError``, so both
    ``except ValueError`` and verl-style ``except AssertionError`` / ``pytest.raises(AssertionError)`` catch it.
    Unlike a bare ``assert``, it is raised under ``python -O`` too.
    """
