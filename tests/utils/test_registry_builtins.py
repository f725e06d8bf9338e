"""A Registry that names the module of its built-in entries imports it on first use, and only then.

This is what lets a registry live below both the config that checks a name and the implementations that register
under it (``verl.workers.config.registries``): the registry's module never imports the implementations, yet a name
check sees the built-ins and every name a user registered.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from verl.utils.registry import Registry

_BUILTINS = "h1_registry_builtins_fixture"


@pytest.fixture
def builtins_module(tmp_path, monkeypatch):
    """A module that registers "builtin" into the registry handed over through a module attribute."""
    (tmp_path / f"{_BUILTINS}.py").write_text(
        textwrap.dedent(
            """
            import h1_registry_target

            h1_registry_target.REGISTRY.add("builtin", "the built-in")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    target = type(sys)("h1_registry_target")
    monkeypatch.setitem(sys.modules, "h1_registry_target", target)
    yield target
    sys.modules.pop(_BUILTINS, None)


def test_the_builtins_are_imported_on_first_read_only(builtins_module):
    registry = Registry("widget", builtins=_BUILTINS)
    builtins_module.REGISTRY = registry
    assert _BUILTINS not in sys.modules  # building the registry imports nothing
    assert registry.names() == ["builtin"]
    assert _BUILTINS in sys.modules
    assert registry.get("builtin") == "the built-in"


def test_a_user_registration_before_any_read_comes_on_top_of_the_builtins(builtins_module):
    registry = Registry("widget", builtins=_BUILTINS)
    builtins_module.REGISTRY = registry
    registry.add("mine", "user's")  # the first write loads the built-ins first, so neither hides the other
    assert registry.names() == ["builtin", "mine"]


def test_a_scoped_block_keeps_the_builtins_it_loaded(builtins_module):
    registry = Registry("widget", builtins=_BUILTINS)
    builtins_module.REGISTRY = registry
    with registry.scoped():
        registry.add("temporary", 1)
    # the built-ins were loaded before the scope was saved, so undoing the scope cannot drop them
    assert registry.names() == ["builtin"]


def test_a_builtins_module_that_fails_to_import_is_tried_again():
    registry = Registry("widget", builtins="h1_no_such_module_anywhere")
    with pytest.raises(ModuleNotFoundError):
        registry.names()
    with pytest.raises(ModuleNotFoundError):  # not marked as loaded after the failure
        registry.get("x")


def test_the_config_registries_know_the_builtins_without_importing_them_first():
    from verl.workers.config.registries import REWARD_MANAGER_REGISTRY, ROLLOUT_REGISTRY

    assert {"hf", "naive", "vllm"} <= set(ROLLOUT_REGISTRY.names())
    assert {"naive", "dapo"} <= set(REWARD_MANAGER_REGISTRY.names())
    from verl.workers.reward_manager import REWARD_MANAGER_REGISTRY as from_package
    from verl.workers.rollout import ROLLOUT_REGISTRY as from_rollouts

    assert from_rollouts is ROLLOUT_REGISTRY and from_package is REWARD_MANAGER_REGISTRY
