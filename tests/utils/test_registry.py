"""The one Registry helper: registration, the duplicate rule, lookup errors."""

import pytest

from verl.utils.registry import Registry


def test_register_and_get():
    registry = Registry("widget")

    @registry.register("a")
    def widget_a():
        return 1

    assert registry.get("a") is widget_a
    assert "a" in registry and "b" not in registry
    assert registry.names() == ["a"] and len(registry) == 1


def test_same_object_twice_is_a_noop():
    registry = Registry("widget")

    def widget():
        return 1

    registry.add("w", widget)
    registry.add("w", widget)
    assert registry.names() == ["w"]


def test_different_object_under_taken_name_is_rejected():
    registry = Registry("widget")
    registry.add("w", lambda: 1)

    def other():
        return 2

    with pytest.raises(ValueError, match="name is taken"):
        registry.add("w", other)


def test_unknown_name_lists_registered_names_and_key():
    registry = Registry("widget", config_key="a.b.widget")
    registry.add("zeta", object())
    registry.add("alpha", object())
    with pytest.raises(ValueError) as info:
        registry.get("gamma")
    message = str(info.value)
    assert "'gamma'" in message and "alpha, zeta" in message and "a.b.widget" in message


@pytest.mark.parametrize("bad", ["", None, 3])
def test_bad_names_are_rejected(bad):
    with pytest.raises(ValueError, match="non-empty string"):
        Registry("widget").add(bad, object())


def test_scoped_registrations_are_undone_and_earlier_ones_kept():
    registry = Registry("thing")
    registry.add("kept", int)
    with registry.scoped() as scoped:
        assert scoped is registry
        registry.add("temporary", str)
        assert registry.names() == ["kept", "temporary"]
    assert registry.names() == ["kept"]
    # also when the block raises: a failing test must not leak its registrations
    with pytest.raises(RuntimeError), registry.scoped():
        registry.add("temporary", str)
        raise RuntimeError("boom")
    assert registry.names() == ["kept"]
