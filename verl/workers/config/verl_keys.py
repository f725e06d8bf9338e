"""Which keys verl's own YAML defines, per trainer config: what decides how a ``+key=value`` override composes here.

Hydra's ``+key=value`` adds a key and refuses one the config already has ("Could not append to config. An item is
already at ..."). verl's scripts therefore put ``+`` before exactly the keys verl's YAML leaves out. This package's
YAML holds some of those keys itself, with their documented defaults (``rollout.enable_sleep_mode``,
``rollout.moe_tensor_parallel_size``, ...), where Hydra's ``+`` would refuse them. The rule here is verl's: ``+`` on
a key that verl's YAML lacks composes (as ``++``: add or set), and ``+`` on a key verl's YAML defines keeps Hydra's
refusal, as it does in verl (:func:`verl.workers.config.compat.command_line_override`). So one mechanism covers every
such key, present and future, with nothing listed by hand.

verl's key layout is data, ``verl_keys.json`` beside this module, written by
``scripts/verl_compat/extract_yaml_keys.py`` from verl's commit (its ``verl_commit``), for each of verl's PPO
trainer configs this package also has (``ppo_trainer``, ``ppo_megatron_trainer``, the fully async and one-step-off
ones). A config file of another name (a recipe's, a user's) is taken to extend ``ppo_trainer``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

__all__ = ["VERL_KEYS_FILE", "defined_in_verl", "verl_commit"]

VERL_KEYS_FILE = Path(__file__).with_name("verl_keys.json")
# what a config file of another name is taken to extend
DEFAULT_CONFIG = "ppo_trainer"


@functools.cache
def _payload() -> dict:
    return json.loads(VERL_KEYS_FILE.read_text(encoding="utf-8"))


def dotted(tree: dict, prefix: str = "") -> set[str]:
    """Every dotted key of a key tree (a mapping whose leaves are null), sections included."""
    keys = set()
    for key, sub in tree.items():
        keys.add(prefix + key)
        if sub:
            keys |= dotted(sub, f"{prefix}{key}.")
    return keys


@functools.cache
def _keys(config_name: str) -> frozenset[str]:
    payload = _payload()
    if config_name in payload["trees"]:
        return frozenset(dotted(payload["trees"][config_name]))
    entry = payload["configs"].get(config_name)
    if entry is None:
        return _keys(DEFAULT_CONFIG)
    return frozenset((_keys(entry["like"]) - set(entry["removed"])) | set(entry["added"]))


def defined_in_verl(key: str, config_name: str = DEFAULT_CONFIG) -> bool:
    """Whether verl's YAML defines the dotted ``key`` (a leaf or a section) in its config ``config_name`` (``.yaml``
    or not; another name: ``ppo_trainer``'s keys)."""
    return key in _keys(Path(config_name).name.removesuffix(".yaml"))


def verl_commit() -> str:
    """verl's commit whose YAML the key layout was read from."""
    return _payload()["verl_commit"]
