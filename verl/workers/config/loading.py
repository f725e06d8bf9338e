"""Composing the YAML config: the one place Hydra runs, for the command line, scripts, tests and benchmarks.

:func:`compose_with_defaults` composes a config file (``ppo_trainer.yaml`` by default, or any file of any config
folder, such as ``ppo_megatron_trainer.yaml`` or a recipe's) with Hydra's override syntax, exactly as
``python -m verl.trainer.main_ppo key=value`` does, and the same file without overrides next to it: its defaults,
against which :meth:`~verl.workers.config.PPOConfig.from_omegaconf` refuses settings that nothing would read.
Composition leaves Hydra's global state as it found it, also when the caller has initialised Hydra itself.
:func:`compose_ppo_config` composes and validates; :func:`compose_omegaconf` gives the composed config alone;
:func:`load_section` gives one validated section (``actor_rollout_ref.actor``, ``critic``...) of the defaults with
some keys changed, for code that builds one model without a whole run. :func:`plain_values` and :func:`default_at`
(:mod:`verl.workers.config.values`, importable from here too) read a composed config for validation.

The embedded layer: when the composed config leaves ``actor_rollout_ref.model.path`` at ``"default"`` (the embedded
tiny model), composition selects ``embedded/tiny_grpo_fp16.yaml`` in the ``embedded@_global_`` slot of
``ppo_trainer.yaml``'s defaults list. It lands after ``ppo_trainer.yaml``'s own values (verl's defaults), before any
file built on it and before the key=value overrides, so README's first command runs the tiny GRPO fp16 task while a
verl script that names its model gets verl's defaults. The decision is made once per call, from the config with the
caller's overrides, and applies to that file's defaults too; it is logged (INFO, ``verl.workers.config.loading``)
with the file it layered in. Hydra is driven through its public API only (:func:`_hydra_initialised_on`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl.workers.config.schema import BaseConfig, build_config
from verl.workers.config.values import default_at, plain_values  # noqa: F401  (their import path before values.py)

if TYPE_CHECKING:
    from verl.workers.config.ppo import PPOConfig

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parents[2] / "trainer" / "config"
# The defaults-list slot of ppo_trainer.yaml that the embedded layer fills, and the layer (embedded/<name>.yaml).
EMBEDDED_LAYER_SLOT = "embedded@_global_"
EMBEDDED_LAYER = "tiny_grpo_fp16"
EMBEDDED_MODEL_PATH = "default"


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


@contextlib.contextmanager
def _hydra_initialised_on(config_dir: Path) -> Iterator[None]:
    """Hydra initialised on ``config_dir`` for the block, through Hydra's public API only.

    Hydra allows one initialisation per process (``GlobalHydra``). A caller's own (``@hydra.main``,
    ``initialize_config_dir``) is set aside with ``GlobalHydra.instance().clear()`` and put back afterwards with
    ``GlobalHydra.instance().initialize``, together with the caller's version base, so that the caller keeps
    composing from its own folder.
    """
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.version import VersionBase

    global_hydra = GlobalHydra.instance()
    callers = global_hydra.hydra if global_hydra.is_initialized() else None
    version_base = VersionBase.instance().getbase() if callers is not None else None
    global_hydra.clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            yield
    finally:
        GlobalHydra.instance().clear()
        if callers is not None:
            GlobalHydra.instance().initialize(callers)
            VersionBase.instance().setbase(version_base)


def _compose_files(config_dir: str | Path, config_name: str, override_lists: Sequence[Sequence[str]]) -> list:
    """``config_name`` of ``config_dir`` composed once per list of overrides, under one Hydra initialisation; with
    the embedded layer in all of them when the first list's config runs the embedded model (:func:`_embedded_layer`).

    Raises:
        ValueError: the config does not compose (a missing file, a malformed override, a key it does not have).
    """
    from hydra import compose
    from hydra.errors import HydraException

    config_dir = Path(config_dir).resolve()
    try:
        with _hydra_initialised_on(config_dir):
            first = compose(config_name=config_name, overrides=list(override_lists[0]), return_hydra_config=True)
            layer = _embedded_layer(first, override_lists[0])
            if layer:
                logger.info(
                    "actor_rollout_ref.model.path=%s: layered %s in over %s.yaml (%s; ~%s removes it)",
                    EMBEDDED_MODEL_PATH,
                    f"embedded/{EMBEDDED_LAYER}.yaml",
                    config_name,
                    layer[0],
                    EMBEDDED_LAYER_SLOT,
                )
            configs = []
            for index, overrides in enumerate(override_lists):
                if index == 0 and not layer:
                    configs.append(_plain(first))
                elif index > 0 and not overrides:  # compose_with_defaults' defaults: the same for every caller
                    configs.append(_defaults_of(config_dir, config_name, tuple(layer)))
                else:
                    configs.append(_plain(compose(config_name=config_name, overrides=[*layer, *overrides])))
    except (HydraException, OmegaConfBaseException) as err:
        raise ValueError(str(err).strip()) from None
    return configs


def _plain(config: DictConfig) -> DictConfig:
    """A plain (non-struct) config without Hydra's own section, as callers have always received."""
    plain = OmegaConf.to_container(config, resolve=False)
    plain.pop("hydra", None)
    return OmegaConf.create(plain)


# The defaults of a config file (with the embedded layer or not), by the files' state: composing them is half the
# cost of every composition (Hydra parses each YAML file anew), and they only change when a file does.
_DEFAULTS: dict[tuple, DictConfig] = {}


def _defaults_of(config_dir: Path, config_name: str, layer: tuple[str, ...]) -> DictConfig:
    """The composed defaults of ``config_name``, composed once per state of the directory's YAML files and shared,
    read-only (what a setting is compared against, never changed); called under :func:`_hydra_initialised_on`
    ``config_dir``."""
    from hydra import compose

    files = sorted(config_dir.rglob("*.yaml"))
    key = (config_dir, config_name, layer, tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files))
    if key not in _DEFAULTS:
        defaults = _plain(compose(config_name=config_name, overrides=list(layer)))
        OmegaConf.set_readonly(defaults, True)
        _DEFAULTS[key] = defaults
    return _DEFAULTS[key]


def _embedded_layer(composed: DictConfig, overrides: Sequence[str]) -> list[str]:
    """The override that selects the embedded layer (a one-item list), or ``[]``: the config has no slot for it,
    the caller's overrides choose the slot themselves, or the model is not the embedded one."""
    if EMBEDDED_LAYER_SLOT not in composed.hydra.runtime.choices:
        return []  # a config not built on ppo_trainer.yaml
    slot_group = EMBEDDED_LAYER_SLOT.split("@", 1)[0]
    if any(override.lstrip("+~").split("=", 1)[0].split("@", 1)[0] == slot_group for override in overrides):
        return []
    try:
        path = OmegaConf.select(composed, "actor_rollout_ref.model.path", default=None)
    except OmegaConfBaseException:
        return []  # an interpolation that does not resolve: validation names it
    return [f"{EMBEDDED_LAYER_SLOT}={EMBEDDED_LAYER}"] if path == EMBEDDED_MODEL_PATH else []


def compose_with_defaults(
    overrides: Sequence[str] = (), config_name: str = "ppo_trainer", config_dir: str | Path = CONFIG_DIR
) -> ComposedConfig:
    """``config_name`` of ``config_dir`` with Hydra-style ``overrides``, and the same file's defaults.

    Raises:
        ValueError: the config does not compose; the message is Hydra's.
    """
    config, defaults = _compose_files(config_dir, config_name, [overrides, ()])
    return ComposedConfig(config, defaults)


def compose_omegaconf(
    overrides: Sequence[str] = (), config_name: str = "ppo_trainer", config_dir: str | Path = CONFIG_DIR
) -> DictConfig:
    """The composed (unvalidated) config, with Hydra's own section removed.

    Raises:
        ValueError: the config does not compose; the message is Hydra's.
    """
    (config,) = _compose_files(config_dir, config_name, [overrides])
    return config


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
