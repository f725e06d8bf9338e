"""Plain values out of a composed config: the bottom of the config package, below both composition and validation.

Composition (:mod:`verl.workers.config.loading`) produces OmegaConf objects; validation
(:mod:`verl.workers.config.ppo`) works on plain resolved values. The two readers here turn one into the other, so
that neither module has to import the other for them.
"""

from __future__ import annotations

from typing import Any

from omegaconf import Container, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


def plain_values(config: Any) -> dict[str, Any]:
    """A composed config (DictConfig or mapping) as plain resolved values, without Hydra's own section.

    Raises:
        ValueError: an interpolation does not resolve.
    """
    if isinstance(config, DictConfig):
        try:
            config = OmegaConf.to_container(config, resolve=True)
        except OmegaConfBaseException as err:
            raise ValueError(f"the config does not resolve: {err}") from None
    return {key: value for key, value in dict(config).items() if key != "hydra"}


def default_at(defaults: Any, key: str) -> Any:
    """The plain, resolved value of the dotted ``key`` in ``defaults`` (a DictConfig or a nested mapping).

    Raises:
        ValueError: the value does not resolve.
    """
    if not isinstance(defaults, DictConfig):
        for part in key.split("."):
            defaults = defaults[part]
        return defaults
    try:
        value = OmegaConf.select(defaults, key, throw_on_missing=True)  # resolves an interpolation at the key
        return OmegaConf.to_container(value, resolve=True) if isinstance(value, Container) else value
    except OmegaConfBaseException as err:
        raise ValueError(f"the default of {key} does not resolve: {err}") from None
