"""Hydra's composition of the YAML config, below the typed schema: the config folder, the embedded layer's slot and
the composing of a config file with Hydra-style overrides, for any module of :mod:`verl.workers.config`.

This module imports nothing of the typed sections (:mod:`~verl.workers.config.ppo`, ``roles``...), so that those
may read their composed defaults from here (``roles.trainer_yaml_section``, ``verl_named.section_defaults``) without
an import cycle. :mod:`verl.workers.config.loading` builds the validating entry points on it
(``compose_with_defaults``, ``compose_ppo_config``, ``load_section``) and re-exports the public names below, its
import path before this module existed.

The embedded layer: when the composed config leaves ``actor_rollout_ref.model.path`` at ``"default"`` (the embedded
tiny model), composition selects ``embedded/tiny_grpo_fp16.yaml`` in the ``embedded@_global_`` slot of
``ppo_trainer.yaml``'s defaults list (:func:`_embedded_layer`). It is logged (INFO) under the logger
``verl.workers.config.loading``, the name it has always had. Hydra is driven through its public API only
(:func:`_hydra_initialised_on`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from verl.workers.config import out_of_scope
from verl.workers.config.compat import append_refusal, command_line_override

__all__ = [
    "CONFIG_DIR",
    "EMBEDDED_LAYER",
    "EMBEDDED_LAYER_SLOT",
    "EMBEDDED_MODEL_PATH",
    "VERL_CONFIG_SEARCHPATH",
    "compose_files",
    "compose_omegaconf",
]

# the name users' logging configs and the docs know the embedded layer's INFO line by (where it was logged first)
logger = logging.getLogger("verl.workers.config.loading")

CONFIG_DIR = Path(__file__).resolve().parents[2] / "trainer" / "config"
# The defaults-list slot of ppo_trainer.yaml that the embedded layer fills, and the layer (embedded/<name>.yaml).
EMBEDDED_LAYER_SLOT = "embedded@_global_"
EMBEDDED_LAYER = "tiny_grpo_fp16"
EMBEDDED_MODEL_PATH = "default"
# How verl's recipes name verl's config folder in their hydra.searchpath (relative to verl's repository).
VERL_CONFIG_SEARCHPATH = "file://verl/trainer/config"


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


def compose_files(config_dir: str | Path, config_name: str, override_lists: Sequence[Sequence[str]]) -> list:
    """``config_name`` of ``config_dir`` composed once per list of overrides, under one Hydra initialisation; with
    the embedded layer in all of them when the first list's config runs the embedded model (:func:`_embedded_layer`).
    An empty list after the first gives the file's defaults (composed once per state of the files, shared and
    read-only).

    Raises:
        ValueError: the config does not compose (a missing file, a malformed override, a key it does not have).
    """
    from hydra import compose
    from hydra.errors import HydraException

    config_dir = Path(config_dir).resolve()
    # verl's "+key" on a key verl's YAML lacks, entries of open mappings without "+": see compat.command_line_override
    override_lists = [[command_line_override(item, config_name) for item in overrides] for overrides in override_lists]
    searchpath = _searchpath_override(config_dir, config_name, override_lists[0])
    try:
        with _hydra_initialised_on(config_dir):
            first = compose(
                config_name=config_name, overrides=[*searchpath, *override_lists[0]], return_hydra_config=True
            )
            layer = [*searchpath, *_embedded_layer(first, override_lists[0])]
            if layer[len(searchpath) :]:
                logger.info(
                    "actor_rollout_ref.model.path=%s: layered %s in over %s.yaml (%s; ~%s removes it)",
                    EMBEDDED_MODEL_PATH,
                    f"embedded/{EMBEDDED_LAYER}.yaml",
                    config_name,
                    layer[-1],
                    EMBEDDED_LAYER_SLOT,
                )
            configs = []
            for index, overrides in enumerate(override_lists):
                if index == 0 and layer == searchpath:
                    configs.append(_plain(first))
                elif index > 0 and not overrides:  # compose_with_defaults' defaults: the same for every caller
                    configs.append(_defaults_of(config_dir, config_name, tuple(layer)))
                else:
                    configs.append(_plain(compose(config_name=config_name, overrides=[*layer, *overrides])))
    except (HydraException, OmegaConfBaseException) as err:
        refusals = (out_of_scope.override_message(override) for override in override_lists[0])
        message = str(err).strip()
        raise ValueError(next((why for why in refusals if why), append_refusal(message) or message)) from None
    return configs


def _searchpath_override(config_dir: Path, config_name: str, overrides: Sequence[str]) -> list[str]:
    """A ``hydra.searchpath`` override (a one-item list) that points verl's relative ``file://verl/trainer/config``
    at this package's config folder, or ``[]``.

    verl's recipes name verl's config folder from their primary config as ``hydra: searchpath:
    [file://verl/trainer/config]``, a path relative to the working directory (verl's repository). Where the working
    directory has no such folder, the entry is taken to mean this package's (``pkg://verl.trainer.config`` says the
    same from anywhere); the other entries are kept. Nothing changes when the folder exists or when the caller's
    overrides set ``hydra.searchpath`` themselves.
    """
    if any(override.lstrip("+~").startswith("hydra.searchpath") for override in overrides):
        return []
    try:
        entries = OmegaConf.select(OmegaConf.load(config_dir / f"{config_name}.yaml"), "hydra.searchpath") or []
    except (OSError, OmegaConfBaseException):
        return []  # not a file of this folder (Hydra reports a missing one), or not YAML: Hydra's message says so
    entries = [str(entry) for entry in entries]
    relative = Path(VERL_CONFIG_SEARCHPATH.removeprefix("file://"))
    fixed = [
        f"file://{CONFIG_DIR}" if entry.rstrip("/") == VERL_CONFIG_SEARCHPATH and not relative.is_dir() else entry
        for entry in entries
    ]
    if fixed == entries:
        return []
    logger.info("hydra.searchpath of %s.yaml: %s taken as %s", config_name, VERL_CONFIG_SEARCHPATH, CONFIG_DIR)
    return ["hydra.searchpath=[" + ",".join(f"'{entry}'" for entry in fixed) + "]"]


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

    files = sorted({*config_dir.rglob("*.yaml"), *CONFIG_DIR.rglob("*.yaml")})  # the folder, and ours it may search
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


def compose_omegaconf(
    overrides: Sequence[str] = (), config_name: str = "ppo_trainer", config_dir: str | Path = CONFIG_DIR
) -> DictConfig:
    """The composed (unvalidated) config, with Hydra's own section removed.

    Raises:
        ValueError: the config does not compose; the message is Hydra's.
    """
    (config,) = compose_files(config_dir, config_name, [overrides])
    return config
