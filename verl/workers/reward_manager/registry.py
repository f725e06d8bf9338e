"""The reward-manager registry and the loaders for user-supplied scoring functions.

A reward manager turns a batch of generated responses into ``token_level_scores``; which one runs is the config
key ``reward_model.reward_manager``. Users add their own with ``@register("name")`` (verl's decorator name;
``register_reward_manager`` is the same function) in a module their config imports. :data:`REWARD_MANAGER_REGISTRY`
is a :class:`verl.utils.registry.Registry`, which also answers the dict operations (``in``, ``[name]``, ``update``,
``clear``, ...) that code written for verl's dict of the same name uses.

A custom scorer ``compute_score(data_source, solution_str, ground_truth, extra_info)`` can be named two ways:

- ``reward_model.custom_score_fn``: one ``"module.path:function"`` or ``"path/to/file.py:function"`` string,
  loaded by :func:`load_custom_score_fn`;
- verl's ``custom_reward_function.path`` + ``custom_reward_function.name``: a Python file (or ``pkg://module``)
  and a function name in it, loaded by :func:`load_custom_reward_function` the way verl loads them.

Either way the code is imported like a training script: it is trusted code.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from verl.workers.config.registries import REWARD_MANAGER_REGISTRY

__all__ = [
    "REWARD_MANAGER_REGISTRY",
    "get_reward_manager_cls",
    "list_reward_managers",
    "load_custom_reward_function",
    "load_custom_score_fn",
    "register",
    "register_reward_manager",
]

# defined below the config that checks reward_model.reward_manager (which imports nothing from this package)

# verl's prefixes for custom_reward_function.path: an importable module, or an explicit file path
_PKG_PREFIX = "pkg://"
_FILE_PREFIX = "file://"


def register(name: str) -> Callable[[type], type]:
    """Class decorator registering a reward manager under ``name`` (the same class twice is a no-op).

    Raises:
        ValueError: when ``name`` already holds a different class.
    """
    return REWARD_MANAGER_REGISTRY.register(name)


# the name this project used before adopting verl's
register_reward_manager = register


def get_reward_manager_cls(name: str) -> type:
    """The reward manager class registered as ``name``.

    Raises:
        ValueError: unknown name; the message starts ``Unknown reward manager: <name>``, as verl's, and lists the
            registered ones.
    """
    return REWARD_MANAGER_REGISTRY.get(name)


def list_reward_managers() -> list[str]:
    """Registered reward manager names, sorted."""
    return REWARD_MANAGER_REGISTRY.names()


def _exec_file_module(path: Path) -> ModuleType:
    """Execute a Python file as a fresh module named after its absolute path.

    The module sits in ``sys.modules`` only while it executes (decorators such as ``@dataclass`` look their
    module up there); afterwards it is removed, so cloudpickle ships its functions to Ray workers by value instead
    of by a module name the workers could not import.
    """
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    module_name = f"verl_custom_reward_{resolved.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot build an import spec for {str(resolved)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(module_name, None)
    return module


def _callable_names(module: ModuleType) -> list[str]:
    return sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))


def load_custom_score_fn(spec: str) -> Callable[..., Any]:
    """Import a scoring function named ``"module.path:function"`` or ``"path/to/file.py:function"``.

    This is the loader for ``reward_model.custom_score_fn``. The function is called like the default dispatch:
    ``fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...) -> float`` (or a dict with a
    ``"score"`` entry).

    Raises:
        ValueError: the string is not ``source:function``, the file is missing, the import fails, the attribute
            is missing, or it is not callable; every message names ``reward_model.custom_score_fn`` and the fix.
    """
    key = f"reward_model.custom_score_fn={spec!r}"
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(part.strip() for part in spec.split(":")):
        raise ValueError(
            f"{key}: a custom reward function must be given as 'module.path:function' or 'path/to/file.py:function'."
        )
    source, function_name = (part.strip() for part in spec.split(":"))
    if source.endswith(".py") and not Path(source).is_file():
        raise ValueError(f"{key}: file {source!r} does not exist; give an existing path (absolute or relative).")
    try:
        module = _exec_file_module(Path(source)) if source.endswith(".py") else importlib.import_module(source)
    except Exception as err:
        raise ValueError(
            f"{key}: importing {source!r} failed ({type(err).__name__}: {err}). Make sure the module is importable "
            "(on PYTHONPATH in every worker process) and imports cleanly."
        ) from err
    if not hasattr(module, function_name):
        raise ValueError(
            f"{key}: {source!r} has no attribute {function_name!r}; its public callables are {_callable_names(module)}."
        )
    function = getattr(module, function_name)
    if not callable(function):
        raise ValueError(
            f"{key}: {function_name!r} is a {type(function).__name__}, not a function. Point at a function "
            "(data_source, solution_str, ground_truth, extra_info=None) -> float."
        )
    return function


def _import_reward_module(location: str, name: str) -> ModuleType:
    """Import the module ``custom_reward_function.path`` names: ``pkg://`` an installed module, else a file.

    Raises:
        ValueError: a missing file, or a module whose import fails (the error's type and message are kept).
    """
    try:
        if location.startswith(_PKG_PREFIX):
            return importlib.import_module(location[len(_PKG_PREFIX) :].replace("/", "."))
        file_path = Path(location.removeprefix(_FILE_PREFIX))
        if not file_path.is_file():
            raise ValueError(
                f"custom_reward_function.path={location!r}: file {str(file_path)!r} does not exist (relative "
                f"paths start at {os.getcwd()!r}); give the path of the Python file that defines {name!r}."
            )
        return _exec_file_module(file_path)
    except ValueError:
        raise
    except Exception as err:
        raise ValueError(
            f"custom_reward_function.path={location!r}: loading the module failed ({type(err).__name__}: {err}). "
            "Fix the error in that file, or point the path at another one."
        ) from err


def _reward_function_from(module: ModuleType, location: str, name: str) -> Callable[..., Any]:
    """The callable ``name`` of ``module`` (loaded from ``location``).

    Raises:
        ValueError: ``name`` is not defined there (the message lists the module's public callables), or is not
            callable.
    """
    if not hasattr(module, name):
        raise ValueError(
            f"custom_reward_function.name={name!r} is not defined in custom_reward_function.path={location!r}; "
            f"its public callables are {_callable_names(module)}."
        )
    function = getattr(module, name)
    if not callable(function):
        raise ValueError(
            f"custom_reward_function.name={name!r} in {location!r} is a {type(function).__name__}, not a function; "
            "point it at a function (data_source, solution_str, ground_truth, extra_info=None) -> float."
        )
    return function


def load_custom_reward_function(
    path: str | os.PathLike, name: str, reward_kwargs: Mapping[str, Any] | None = None
) -> Callable[..., Any]:
    """Load verl's ``custom_reward_function``: the function ``name`` defined in the Python file ``path``.

    ``path`` is resolved as verl does: ``pkg://package.module`` (or ``pkg://package/module``) imports an
    installed module; ``file://some/file.py`` or a plain path (absolute or relative to the working directory)
    executes that file as a fresh module. The function is called as
    ``fn(data_source=..., solution_str=..., ground_truth=..., extra_info=...)``.

    Args:
        path: ``custom_reward_function.path``.
        name: ``custom_reward_function.name``, the function's name in that module.
        reward_kwargs: ``custom_reward_function.reward_kwargs``; when non-empty, the returned function adds them
            to every call, taking precedence over the call's own keyword arguments (verl's rule).

    Returns:
        The function, or a wrapper adding ``reward_kwargs``.

    Raises:
        ValueError: an empty path or name, a missing file, a failing import, a missing attribute, or an attribute
            that is not callable; each message names ``custom_reward_function.path`` / ``.name``.
    """
    if not path or not str(path).strip():
        raise ValueError(
            "custom_reward_function.path is empty; set it to a Python file (or pkg://module) that defines the "
            "reward function, or leave custom_reward_function unset to use the built-in scorers."
        )
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"custom_reward_function.name is {name!r}; set it to the name of the function in "
            f"custom_reward_function.path={str(path)!r}."
        )
    location = str(path).strip()
    function = _reward_function_from(_import_reward_module(location, name), location, name)
    extra = dict(reward_kwargs or {})
    if not extra:
        return function

    @functools.wraps(function)
    def with_reward_kwargs(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **{**kwargs, **extra})

    return with_reward_kwargs
