"""Composing the YAML config: the one place Hydra runs, for the command line, scripts, tests and benchmarks.

:func:`compose_with_defaults` composes a config file (``ppo_trainer.yaml`` by default, or any file of any config
folder, such as ``ppo_megatron_trainer.yaml`` or a recipe's) with Hydra's override syntax, exactly as
``python -m verl.trainer.main_ppo key=value`` does, and the same file without overrides next to it: its defaults,
against which :meth:`~verl.workers.config.PPOConfig.from_omegaconf` refuses settings that nothing would read.
Composition leaves Hydra's global state as it found it, also when the caller has initialised Hydra itself.
:func:`compose_ppo_config` composes and validates; :func:`compose_omegaconf` gives the composed config alone;
:func:`load_section` gives one validated section (``actor_rollout_ref.actor``, ``critic``...) of the defaults with
some keys changed, for code that builds one model without a whole run. :func:`plain_values` and :func:`default_at`
(:mod:`verl.workers.config.values`, importable from here too) read a composed config for validation. Hydra itself
runs in :mod:`verl.workers.config.composition` (the config folder, the embedded layer, :func:`compose_omegaconf`),
which imports no typed section, so that the sections may read their own defaults from it; its public names are
importable from here as before.

The embedded layer: when the composed config leaves ``actor_rollout_ref.model.path`` at ``"default"`` (the embedded
tiny model), composition selects ``embedded/tiny_grpo_fp16.yaml`` in the ``embedded@_global_`` slot of
``ppo_trainer.yaml``'s defaults list. It lands after ``ppo_trainer.yaml``'s own values (verl's defaults), before any
file built on it and before the key=value overrides, so README's first command runs the tiny GRPO fp16 task while a
verl script that names its model gets verl's defaults. The decision is made once per call, from the config with the
caller's overrides, and applies to that file's defaults too; it is logged (INFO, ``verl.workers.config.loading``)
with the file it layered in. Hydra is driven through its public API only
(:func:`verl.workers.config.composition._hydra_initialised_on`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

# the composition itself (below the typed sections, which read their defaults from it); importable from here too
from verl.workers.config.composition import (  # noqa: F401  (their import path before composition.py)
    CONFIG_DIR,
    EMBEDDED_LAYER,
    EMBEDDED_LAYER_SLOT,
    EMBEDDED_MODEL_PATH,
    VERL_CONFIG_SEARCHPATH,
    compose_files,
    compose_omegaconf,
)
from verl.workers.config.schema import BaseConfig, build_config
from verl.workers.config.values import default_at, plain_values  # noqa: F401  (their import path before values.py)

if TYPE_CHECKING:
    from verl.workers.config.ppo import PPOConfig


@dataclasses.dataclass(frozen=True)
class ComposedConfig:
    """A composed config together with the defaults of the file it was composed from.

    Attributes:
        config: the file with the overrides applied (unresolved, without Hydra's own section).
        defaults: the same file without overrides: what "changed from its default" is measured against.
    """

    config: DictConfig
    defaults: DictConfig

    def validate(self) -> PPOConfig:
        """The typed :class:`~verl.workers.config.PPOConfig`, settings that nothing reads refused.

        Raises:
            ValueError: as :meth:`~verl.workers.config.PPOConfig.from_omegaconf`.
        """
        from verl.workers.config.ppo import PPOConfig

        return PPOConfig.from_omegaconf(self.config, defaults=self.defaults)


def compose_with_defaults(
    overrides: Sequence[str] = (), config_name: str = "ppo_trainer", config_dir: str | Path = CONFIG_DIR
) -> ComposedConfig:
    """``config_name`` of ``config_dir`` with Hydra-style ``overrides``, and the same file's defaults.

    Raises:
        ValueError: the config does not compose; the message is Hydra's.
    """
    config, defaults = compose_files(config_dir, config_name, [overrides, ()])
    return ComposedConfig(config, defaults)


def compose_ppo_config(
    overrides: Sequence[str] = (), config_name: str = "ppo_trainer", config_dir: str | Path = CONFIG_DIR
) -> PPOConfig:
    """A validated :class:`~verl.workers.config.PPOConfig` from the YAML plus Hydra-style ``overrides``.

    Raises:
        ValueError: the config does not compose, or does not validate (as the command line's exit code 2).
    """
    return compose_with_defaults(overrides, config_name, config_dir).validate()


def load_section(cls: type[BaseConfig], overrides: Mapping[str, Any] | None = None, config_name="ppo_trainer"):
    """One section of the default config (``cls.KEY``) with ``overrides`` merged in (nested dicts merge).

    Example: ``load_section(ActorConfig, {"dtype": "float32", "optim": {"lr": 1e-2}})``.
    """
    defaults = compose_omegaconf((), config_name)
    section = OmegaConf.select(defaults, cls.KEY)
    merged = OmegaConf.merge(section, OmegaConf.create(dict(overrides or {})))
    # interpolations (${data.max_response_length}) resolve against the whole config
    OmegaConf.update(defaults, cls.KEY, merged, merge=False)
    return build_config(cls, OmegaConf.to_container(OmegaConf.select(defaults, cls.KEY), resolve=True), cls.KEY)
