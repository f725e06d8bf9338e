"""The reward-manager registry used the way verl code uses it: as a dict, through ``register`` and
``get_reward_manager_cls``. Every test works inside ``scoped()`` so the built-in ``naive`` comes back afterwards."""

import pytest

from verl.workers.reward_manager import NaiveRewardManager, get_reward_manager_cls, register
from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY


@pytest.fixture
def registry():
    """The real registry, emptied and refilled with two placeholder entries for the test, restored afterwards."""
    with REWARD_MANAGER_REGISTRY.scoped():
        REWARD_MANAGER_REGISTRY.clear()
        REWARD_MANAGER_REGISTRY.update({"first": "FirstManager", "second": "SecondManager"})
        yield REWARD_MANAGER_REGISTRY


def test_lookup_by_name_and_item(registry):
    assert get_reward_manager_cls("first") == "FirstManager"
    assert registry["second"] == "SecondManager"
    assert "first" in registry and len(registry) == 2


def test_unknown_name_message_starts_like_verls(registry):
    with pytest.raises(ValueError) as info:
        get_reward_manager_cls("missing")
    message = str(info.value)
    assert message.startswith("Unknown reward manager: missing")
    # beyond verl's text: the config key and what is registered
    assert "reward_model.reward_manager" in message and "Registered: first, second." in message


def test_names_are_case_sensitive(registry):
    for name in ("FIRST", "First"):
        with pytest.raises(ValueError, match=f"Unknown reward manager: {name}"):
            get_reward_manager_cls(name)


def test_cleared_registry_knows_no_name(registry):
    registry.clear()
    with pytest.raises(ValueError, match=r"Unknown reward manager: anything .*Registered: \(none\)"):
        get_reward_manager_cls("anything")


def test_register_returns_the_class_unchanged_and_rejects_a_second_class(registry):
    @register("mine")
    class Mine:
        def score(self):
            return 42

    assert Mine().score() == 42 and registry["mine"] is Mine

    with pytest.raises(ValueError, match="the name is taken"):

        @register("mine")
        class Other:
            pass

    assert registry["mine"] is Mine


def test_scoped_fixture_restores_the_builtin():
    # runs after the fixture-using tests in this file: their clear() must not have leaked
    assert get_reward_manager_cls("naive") is NaiveRewardManager
