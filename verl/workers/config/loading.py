"""Composing the YAML config outside the command line: for scripts, tests and benchmarks.

:func:`compose_ppo_config` composes ``ppo_trainer.yaml`` (or another config of the same folder) with Hydra's
override syntax, exactly as ``python -m verl.trainer.main_ppo key=value`` would, and validates it.
:func:`load_section` gives one validated section (``actor_rollout_ref.actor``, ``critic``...) of the defaults with
some keys changed, for code that builds one model without a whole run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl.workers.config.schema import BaseConfig, build_config

CONFIG_DIR = Path(__file__).resolve().parents[2] / "trainer" / "config"


def compose_omegaconf(overrides: Sequence[str] = (), config_name: str = "ppo_trainer") -> DictConfig:
    """The composed (unvalidated) config, with Hydra's own section removed."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = compose(config_name=config_name, overrides=list(overrides))
    with_hydra = OmegaConf.to_container(config, resolve=False)
    with_hydra.pop("hydra", None)
    return OmegaConf.create(with_hydra)


def compose_ppo_config(overrides: Sequence[str] = (), config_name: str = "ppo_trainer"):
    """A validated :class:`~verl.workers.config.PPOConfig` from the YAML plus Hydra-style ``overrides``."""
    from verl.workers.config.ppo import PPOConfig

    return PPOConfig.from_omegaconf(compose_omegaconf(overrides, config_name))


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
