"""``ray_kwargs``: verl's section for Ray itself, and how it joins the older top-level ``ray_init`` section.

verl's current release passes ``ray_kwargs.ray_init`` to ``ray.init`` as keyword arguments (``num_cpus``,
``runtime_env`` with ``runtime_env.py_executable``, and anything else ``ray.init`` takes), with its own runtime
environment underneath the user's, and after training writes Ray's timeline to ``ray_kwargs.timeline_json_file``.
This project's older section, ``ray_init`` (``address``, ``num_cpus``), keeps working: the two are one request
(:func:`merged_ray_init`), and a key set in both to different values is refused, naming both.

Every name under ``ray_kwargs.ray_init`` is checked against the signature of the installed ``ray.init`` when the
config is validated, so a misspelt argument stops the run before Ray starts, not inside ``ray.init``.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any, ClassVar

from verl.workers.config.schema import BaseConfig, FieldError

# the older section's keys that ray_kwargs.ray_init may also set
_SHARED_KEYS = ("address", "num_cpus")


def ray_init_parameters() -> frozenset[str]:
    """The keyword arguments the installed ``ray.init`` names in its signature (its ``**kwargs`` aside)."""
    import inspect

    import ray

    parameters = inspect.signature(ray.init).parameters
    return frozenset(name for name, p in parameters.items() if p.kind is not inspect.Parameter.VAR_KEYWORD)


@dataclasses.dataclass(frozen=True)
class RayKwargsConfig(BaseConfig):
    """``ray_kwargs``, as in verl.

    Attributes:
        ray_init: keyword arguments of ``ray.init`` (null values are left to Ray's defaults). ``runtime_env`` is
            merged over this project's own (the workers' ``PYTHONPATH`` and thread count); its ``py_executable``
            starts the workers with that command (verl's scripts set a ``uv run ...`` prefix), null: this Python.
            Names with a leading underscore go to ``ray.init``'s private arguments, which Ray checks itself.
        timeline_json_file: after training, Ray's timeline of tasks and actors (Chrome trace format) is written
            there (``ray.timeline``); null: none.
    """

    KEY: ClassVar[str] = "ray_kwargs"

    ray_init: dict
    timeline_json_file: str | None

    def check(self) -> None:
        known = ray_init_parameters()
        for name in self.ray_init:
            if name not in known and not str(name).startswith("_"):
                near = difflib.get_close_matches(str(name), sorted(known), n=3)
                hint = f" Did you mean {' or '.join(near)}?" if near else ""
                raise FieldError(
                    f"ray_init.{name}",
                    f"is not an argument of ray.init here; it takes {sorted(known)}.{hint}",
                )
        runtime_env = self.ray_init.get("runtime_env")
        if runtime_env is not None and not isinstance(runtime_env, Mapping):
            raise FieldError("ray_init.runtime_env", f"={runtime_env!r} must be a mapping (Ray's runtime_env) or null.")
        executable = (runtime_env or {}).get("py_executable")
        if executable is not None and (not isinstance(executable, str) or not executable.strip()):
            raise FieldError(
                "ray_init.runtime_env.py_executable",
                f"={executable!r} must be a command that starts Python (a path, or a prefix such as 'uv run') or "
                "null (this Python).",
            )


def merged_ray_init(legacy: Any, ray_kwargs: RayKwargsConfig) -> dict[str, Any]:
    """``ray.init``'s keyword arguments as the two sections ask for them: ``ray_kwargs.ray_init`` without its null
    values, and ``address`` / ``num_cpus`` from whichever section sets them (``address`` None: a local instance).
    The runtime environment is the user's alone here; :func:`runtime_env_over` lays it over the project's.

    Args:
        legacy: the ``ray_init`` section (``address``, ``num_cpus``).
        ray_kwargs: the ``ray_kwargs`` section.

    Raises:
        ValueError: ``address`` or ``num_cpus`` set in both sections to different values.
    """
    merged = {name: value for name, value in ray_kwargs.ray_init.items() if value is not None}
    for name in _SHARED_KEYS:
        old, new = getattr(legacy, name), merged.get(name)
        if old is not None and new is not None and old != new:
            raise ValueError(
                f"ray_init.{name}={old!r} and ray_kwargs.ray_init.{name}={new!r} disagree: they are one setting "
                f"(ray_init is this project's older spelling of verl's ray_kwargs.ray_init). Set one of them, or "
                "both to the same value."
            )
        merged[name] = old if new is None else new
    runtime_env = dict(merged.pop("runtime_env", None) or {})
    if runtime_env.get("py_executable") is None:
        runtime_env.pop("py_executable", None)
    if runtime_env:
        merged["runtime_env"] = runtime_env
    return merged


def source_key(legacy: Any, ray_kwargs: RayKwargsConfig, name: str) -> str:
    """The key the user set ``name`` with (``ray_kwargs.ray_init.<name>`` or ``ray_init.<name>``), for messages."""
    if ray_kwargs.ray_init.get(name) is not None or getattr(legacy, name, None) is None:
        return f"ray_kwargs.ray_init.{name}"
    return f"ray_init.{name}"


def runtime_env_over(base: Mapping[str, Any], user: Mapping[str, Any] | None) -> dict[str, Any]:
    """``user``'s runtime environment laid over ``base`` (the project's), as verl merges its own under the user's:
    mappings merge key by key (``env_vars`` keeps both sides' variables), anything else the user gives wins."""
    merged = dict(base)
    for key, value in (user or {}).items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = runtime_env_over(merged[key], value)
        else:
            merged[key] = value
    return merged
