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
    # verl's shape, "Unknown <kind>: <name>", then the config key and the registered names
    assert message.startswith("Unknown widget: gamma (config key `a.b.widget`). Registered: alpha, zeta.")


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


def test_get_with_default_returns_it_for_unknown_names_only():
    registry = Registry("widget")
    registry.add("a", int)
    assert registry.get("a", None) is int
    assert registry.get("missing", None) is None
    sentinel = object()
    assert registry.get("missing", sentinel) is sentinel


def test_dict_operations_like_verls_registries():
    registry = Registry("widget")
    registry.update({"b": str}, a=int)
    registry["c"] = float
    assert registry["a"] is int and registry["b"] is str and registry["c"] is float
    assert registry.keys() == ["a", "b", "c"] and list(registry) == ["a", "b", "c"]
    assert registry.values() == [int, str, float]
    assert registry.items() == [("a", int), ("b", str), ("c", float)]
    del registry["b"]
    assert "b" not in registry and len(registry) == 2
    registry.clear()
    assert len(registry) == 0 and registry.names() == []


def test_dict_writes_keep_the_duplicate_rule():
    registry = Registry("widget")
    registry["w"] = int
    registry["w"] = int  # the same object again: a no-op
    with pytest.raises(ValueError, match="name is taken"):
        registry["w"] = str
    with pytest.raises(ValueError, match="name is taken"):
        registry.update({"w": str})
    assert registry["w"] is int


def test_dict_reads_of_unknown_names_keep_the_error_shape():
    registry = Registry("widget")
    with pytest.raises(ValueError, match="^Unknown widget: nope"):
        registry["nope"]
    with pytest.raises(ValueError, match="^Unknown widget: nope"):
        del registry["nope"]
