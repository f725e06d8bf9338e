"""The ``reward`` section: verl's current spelling of the reward settings, and how it meets the older one.

verl's current release (1dda039) gathers the reward settings in one top-level section, ``reward``
(``reward/reward.yaml``): ``num_workers``, ``custom_reward_function.{path,name}``, ``reward_manager.name``,
``reward_kwargs``, ``reward_model.{enable,model_path,rollout.*}`` and ``sandbox_fusion.*``. The older keys,
``reward_model.*`` and ``custom_reward_function.*``, still work in verl and here.

One description, one code path. The older sections stay the typed description of the reward that the trainer and
the workers read (:class:`~verl.workers.config.reward_model.RewardModelConfig` and
:class:`CustomRewardFunctionConfig`). :func:`resolve_reward_section` checks the ``reward`` section
(:class:`RewardConfig`, every key typed, with its full key in every message), writes each value it sets into its
twin among the older keys (:data:`TWINS`), and removes the section, before :class:`~verl.workers.config.PPOConfig` is
built. So ``reward.reward_manager.name=dapo`` and ``reward_model.reward_manager=dapo`` build the same config, and
nothing downstream knows which spelling a script used.

Precedence. In the YAML each key of ``reward`` defaults to its older twin (an interpolation), so the defaults never
disagree. A key counts as set when its value differs from its default in the file the config was composed from.
When one spelling is set, it wins; when both are set to the same value, that value; when both are set to different
values, start-up stops with an error that names both keys. ``reward_kwargs`` is compared key by key, so
``reward.reward_kwargs.max_resp_len`` and ``reward_model.reward_kwargs.overlong_buffer_cfg`` combine. Without the
defaults (a config validated on its own), a value of the ``reward`` section that differs from its twin is taken as
set there and wins, and disagreement cannot be told apart from it.

verl's current release always serves a reward model through its reward loop (an inference engine with
``reward_model.rollout.*``). A reward model described through ``reward.reward_model.*`` therefore turns on
``reward_model.use_reward_loop``: its lengths (``rollout.prompt_length + response_length``) bound what the model reads
and it scores in micro-batches of tokens, as described in :mod:`verl.workers.config.reward_model`.

What verl's section has and this project lacks is typed and refused when on: a reward manager loaded from a file
(``reward_manager.source=importlib``), a resource pool of the reward model's own (``enable_resource_pool``; its
``n_gpus_per_node`` and ``nnodes`` are refused when changed), sandbox fusion (``sandbox_fusion.url``). verl's engine
keys of ``reward.reward_model.rollout`` that no script sets (sampling, quantization, disaggregation, ...) are not
keys here.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from omegaconf import DictConfig, OmegaConf

from verl.workers.config.reward_model import RewardLoopEngineConfig, SandboxFusionConfig
from verl.workers.config.schema import BaseConfig, FieldError, build_config, check_int, check_one_of, refuse_unavailable
from verl.workers.config.values import default_at

__all__ = [
    "TWINS",
    "CustomRewardFunctionConfig",
    "RewardConfig",
    "RewardManagerConfig",
    "RewardManagerModuleConfig",
    "RewardModelServingConfig",
    "resolve_reward_section",
]

# each key of the reward section (under "reward.") and its twin among the older keys; a mapping pairs key by key
TWINS: tuple[tuple[str, str], ...] = (
    ("num_workers", "reward_model.num_workers"),
    ("custom_reward_function.path", "custom_reward_function.path"),
    ("custom_reward_function.name", "custom_reward_function.name"),
    ("reward_manager.name", "reward_model.reward_manager"),
    ("reward_kwargs", "reward_model.reward_kwargs"),
    ("reward_model.enable", "reward_model.enable"),
    ("reward_model.model_path", "reward_model.model.path"),
    ("reward_model.rollout", "reward_model.rollout"),
    ("sandbox_fusion", "reward_model.sandbox_fusion"),
)

# keys of the reward section that only a feature this project lacks reads: refused when changed from their default
_READ_BY_MISSING_FEATURE: dict[str, str] = {
    "reward_manager.module.name": "reward.reward_manager.source=importlib (not available here)",
    "reward_model.n_gpus_per_node": "reward.reward_model.enable_resource_pool=true (not available here)",
    "reward_model.nnodes": "reward.reward_model.enable_resource_pool=true (not available here)",
}

_ABSENT: Any = object()  # a key a mapping does not have (reward_kwargs' keys)


@dataclasses.dataclass(frozen=True)
class CustomRewardFunctionConfig(BaseConfig):
    """``custom_reward_function`` (and verl's ``reward.custom_reward_function``): a scoring function named by a Python
    file and a function in it."""

    KEY: ClassVar[str] = "custom_reward_function"

    path: str | None
    name: str


@dataclasses.dataclass(frozen=True)
class RewardManagerModuleConfig(BaseConfig):
    """``reward.reward_manager.module``: verl's file holding a reward manager class (``source=importlib``)."""

    KEY: ClassVar[str] = "reward.reward_manager.module"

    path: str | None
    name: str

    def check(self) -> None:
        if self.path is not None:
            raise FieldError(
                "path",
                f"={self.path!r}: loading a reward manager class from a file (verl's source=importlib) is not "
                "available here; register the class with @register('name') from verl.workers.reward_manager, import "
                "it before the run, set reward.reward_manager.name to that name and this key to null.",
            )


@dataclasses.dataclass(frozen=True)
class RewardManagerConfig(BaseConfig):
    """``reward.reward_manager``: the reward manager, by its name in the reward-manager registry."""

    KEY: ClassVar[str] = "reward.reward_manager"

    source: Literal["register", "importlib"]
    name: str
    module: RewardManagerModuleConfig

    def check(self) -> None:
        from verl.workers.config.registries import REWARD_MANAGER_REGISTRY

        if self.source != "register":
            raise FieldError(
                "source",
                f"={self.source!r}: reward managers are found by name in the registry here (source=register); "
                "register yours with @register('name') and set reward.reward_manager.name.",
            )
        check_one_of(self, "name", REWARD_MANAGER_REGISTRY.names(), "registered reward managers")


@dataclasses.dataclass(frozen=True)
class RewardModelServingConfig(BaseConfig):
    """``reward.reward_model``: verl's reward model, served by its reward loop's engine (``rollout``)."""

    KEY: ClassVar[str] = "reward.reward_model"

    enable: bool
    enable_resource_pool: bool
    n_gpus_per_node: int
    nnodes: int
    model_path: str | None
    rollout: RewardLoopEngineConfig

    def check(self) -> None:
        refuse_unavailable(
            self,
            "enable_resource_pool",
            "the reward model scores in a worker group of its own on the actor's ranks (colocated); there is no "
            "separate resource pool for it",
        )
        check_int(self, "n_gpus_per_node", 0)
        check_int(self, "nnodes", 0)


@dataclasses.dataclass(frozen=True)
class RewardConfig(BaseConfig):
    """``reward``: verl's current spelling of the reward settings; see the module docstring for how it resolves."""

    KEY: ClassVar[str] = "reward"

    num_workers: int
    custom_reward_function: CustomRewardFunctionConfig
    reward_manager: RewardManagerConfig
    reward_kwargs: Any
    reward_model: RewardModelServingConfig
    sandbox_fusion: SandboxFusionConfig

    def check(self) -> None:
        check_int(self, "num_workers", 1)
        if not isinstance(self.reward_kwargs, Mapping):
            raise FieldError("reward_kwargs", f"must be a mapping of keyword arguments, got {self.reward_kwargs!r}.")


# ---------------------------------------------------------------------------------------------- resolution


def _leaves(value: Any) -> dict[str, Any]:
    """A value's leaves by dotted sub-key (``""`` for a value that is not a mapping; none for an empty mapping)."""
    if not isinstance(value, Mapping):
        return {"": value}
    leaves: dict[str, Any] = {}
    for key, item in value.items():
        for sub, leaf in _leaves(item).items():
            leaves[f"{key}.{sub}" if sub else str(key)] = leaf
    return leaves


def _at(tree: Any, key: str) -> Any:
    """The value at the dotted ``key`` of a nested mapping, or ``_ABSENT``."""
    for part in key.split("."):
        if not isinstance(tree, Mapping) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


def _put(tree: dict, key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value


def _default_leaves(defaults: Any, key: str) -> dict[str, Any] | None:
    """The leaves of ``key``'s default (``{}`` where the defaults lack it), or None without defaults. Only that key
    is resolved (as :func:`~verl.workers.config.values.default_at` does)."""
    if defaults is None:
        return None
    if isinstance(defaults, DictConfig):
        present = OmegaConf.select(defaults, key, default=_ABSENT, throw_on_resolution_failure=False) is not _ABSENT
    else:
        present = _at(defaults, key) is not _ABSENT
    return _leaves(default_at(defaults, key)) if present else {}


def _full(prefix: str, sub: str) -> str:
    return f"{prefix}.{sub}" if sub else prefix


def _pick(new: Any, old: Any, new_default: Any, old_default: Any, keys: tuple[str, str], known: bool) -> bool:
    """Whether the reward section's value is the one to take (its key is set and says something else).

    Raises:
        ValueError: both keys are set, to different values.
    """
    if new is _ABSENT or new == old:
        return False
    if not known:  # no defaults: a value of the reward section that differs from its twin was set there
        return True
    new_set, old_set = new != new_default, old != old_default
    if new_set and old_set and old is not _ABSENT:
        new_key, old_key = keys
        raise ValueError(
            f"{new_key}={new!r} and {old_key}={old!r} disagree: they are one setting, in verl's current spelling (the "
            "reward section) and the older one. Set only one of them, or both to the same value "
            "(see docs/start/from_verl.md, 'reward')."
        )
    return new_set


def _fold_twin(values: dict, new_prefix: str, old_prefix: str, defaults: Any) -> dict[str, str]:
    """Write the set values of one twin pair into the older key; ``{older key: reward key}`` of what it wrote."""
    new_key = f"reward.{new_prefix}"
    new_leaves, old_leaves = _leaves(_at(values, new_key)), _leaves(_at(values, old_prefix))
    new_defaults, old_defaults = _default_leaves(defaults, new_key), _default_leaves(defaults, old_prefix)
    known = defaults is not None
    written: dict[str, str] = {}
    for sub in list(new_leaves) + [sub for sub in old_leaves if sub not in new_leaves]:
        new, old = new_leaves.get(sub, _ABSENT), old_leaves.get(sub, _ABSENT)
        dn = new_defaults.get(sub, _ABSENT) if known else _ABSENT
        do = old_defaults.get(sub, _ABSENT) if known else _ABSENT
        keys = (_full(new_key, sub), _full(old_prefix, sub))
        if _pick(new, old, dn, do, keys, known):
            _put(values, keys[1], new)
            written[keys[1]] = keys[0]
    return written


def _refuse_unread(section: Mapping, defaults: Any) -> None:
    """Keys of the reward section that only a missing feature reads may not change from their defaults."""
    if defaults is None:
        return
    for key, reader in _READ_BY_MISSING_FEATURE.items():
        default = _default_leaves(defaults, f"reward.{key}").get("", _ABSENT)
        if default is not _ABSENT and _at(section, key) != default:
            raise ValueError(
                f"reward.{key} is set, but nothing reads it: verl reads it with {reader}. Leave it at its default."
            )


def resolve_reward_section(values: dict[str, Any], defaults: Any = None) -> tuple[dict[str, Any], dict[str, str]]:
    """The config's plain values with the ``reward`` section folded into the older keys, and where each came from.

    Args:
        values: the composed config as plain, resolved values (not changed: a changed copy is returned).
        defaults: the composed defaults of the same file (see :meth:`~verl.workers.config.PPOConfig.from_omegaconf`),
            or None; with them, a key is set when it differs from its default, and a disagreement is an error.

    Returns:
        The values without ``reward`` (absent or null: unchanged), its settings in ``reward_model`` and
        ``custom_reward_function``; and ``{older key: reward key}`` for every value taken from the section.

    Raises:
        ValueError: the section does not validate (the message names the ``reward.*`` key); a key of it and its older
            twin are both set to different values; a key only a missing feature reads is changed.
    """
    if values.get("reward") is None:
        return {key: value for key, value in values.items() if key != "reward"}, {}
    build_config(RewardConfig, values["reward"], RewardConfig.KEY)
    _refuse_unread(values["reward"], defaults)
    folded = copy.deepcopy(values)
    origins: dict[str, str] = {}
    for new_prefix, old_prefix in TWINS:
        origins.update(_fold_twin(folded, new_prefix, old_prefix, defaults))
    if any(key.startswith("reward.reward_model.") for key in origins.values()):
        # verl's current release serves a reward model only through its reward loop
        _put(folded, "reward_model.use_reward_loop", True)
        origins["reward_model.use_reward_loop"] = "reward.reward_model"
    del folded["reward"]
    return folded, origins


def name_reward_keys(err: ValueError, origins: Mapping[str, str]) -> ValueError:
    """``err`` about an older key whose value came from the ``reward`` section, with the key the user set named."""
    message = str(err)
    named = [(old, new) for old, new in origins.items() if old in message]
    if not named:
        return err
    notes = "; ".join(f"{old} is set by {new}" for old, new in named)
    return ValueError(f"{message} ({notes}: the reward section and the older keys are one setting)")
