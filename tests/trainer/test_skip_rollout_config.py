"""The typed ``skip`` section: verl's keys, what is accepted, and what is refused by name."""

import pytest

from verl.workers.config.schema import build_config
from verl.workers.config.skip import SkipConfig

OFF = {"enable": False, "dump_dir": "~/.verl/rollout_dump", "steps": [], "action": "cache"}


def skip_section(**rollout) -> dict:
    return {"rollout": {**OFF, **rollout}, "async_rollout": dict(OFF), "rollout_tq": dict(OFF)}


def test_verls_defaults_build():
    skip = build_config(SkipConfig, skip_section())
    assert skip.rollout.enable is False and skip.rollout.steps == [] and skip.rollout.action == "cache"


def test_an_enabled_rollout_skip_builds_with_its_steps():
    skip = build_config(SkipConfig, skip_section(enable=True, steps=[1, 2], action="repeat"))
    assert skip.rollout.steps == [1, 2] and skip.rollout.action == "repeat"
    skip.check_applies(separate_rollout=False)  # the colocated trainer reads it
    # only the unavailable sub-sections' keys stay unread: 2 sub-sections x (dump_dir, steps, action) = 6
    unused = [key for key, _, _ in skip.unused_settings()]
    assert len(unused) == 6 and not any(key.startswith("skip.rollout.") for key in unused)


@pytest.mark.parametrize(
    ("rollout", "match"),
    [
        ({"enable": True}, r"skip.rollout.enable=true with steps=\[\] dumps and replays nothing"),
        ({"steps": [0]}, r"skip.rollout.steps must hold integers >= 1, got 0"),
        ({"action": "random"}, r"skip.rollout.action='random' is not supported; use one of 'cache', 'repeat'"),
        ({"dump_dir": ""}, "skip.rollout.dump_dir is empty"),
        ({"max_dump_step": 2}, "skip.rollout.max_dump_step is not a known config key"),
    ],
)
def test_bad_values_are_refused_with_the_full_key(rollout, match):
    with pytest.raises(ValueError, match=match):
        build_config(SkipConfig, skip_section(**rollout))


@pytest.mark.parametrize(("name", "feature"), [("async_rollout", "fully async"), ("rollout_tq", "TransferQueue")])
def test_verls_other_skips_are_refused_by_name_when_enabled(name, feature):
    values = skip_section()
    values[name] = {**OFF, "enable": True}  # refused by name, before anything else of the section is looked at
    with pytest.raises(ValueError, match=rf"skip.{name}.enable=true asks for a verl feature .*{feature}"):
        build_config(SkipConfig, values)


def test_rollout_skip_with_a_rollout_group_of_its_own_is_refused():
    skip = build_config(SkipConfig, skip_section(enable=True, steps=[1]))
    with pytest.raises(ValueError, match=r"skip.rollout.enable=true .*\(hybrid_engine=false"):
        skip.check_applies(separate_rollout=True)


def test_a_disabled_rollout_skip_lists_its_keys_as_unread():
    skip = build_config(SkipConfig, skip_section(steps=[3]))
    unused = {key: (value, fix) for key, value, fix in skip.unused_settings()}
    assert unused["skip.rollout.steps"] == ([3], "skip.rollout.enable=true")
    rollout_keys = sorted(key for key in unused if key.startswith("skip.rollout."))
    assert rollout_keys == [f"skip.rollout.{key}" for key in ("action", "dump_dir", "enable", "steps")]
    # verl's other sub-sections: everything but their enable (refused by itself), never read
    assert unused["skip.async_rollout.steps"] == (
        [],
        "skip.async_rollout.enable=true, a verl feature this project does not have (use skip.rollout)",
    )
    assert sorted(key for key in unused if not key.startswith("skip.rollout.")) == [
        f"skip.{name}.{key}" for name in ("async_rollout", "rollout_tq") for key in ("action", "dump_dir", "steps")
    ]


def test_the_composed_config_holds_verls_skip_section_off():
    from verl.workers.config import compose_ppo_config

    config = compose_ppo_config([])
    assert [config.skip.rollout.enable, config.skip.async_rollout.enable, config.skip.rollout_tq.enable] == [False] * 3
    assert config.skip.rollout.dump_dir == "~/.verl/rollout_dump" and config.skip.rollout.action == "cache"
    enabled = compose_ppo_config(["skip.rollout.enable=true", "skip.rollout.steps=[1,2]", "skip.rollout.action=repeat"])
    assert enabled.skip.rollout.steps == [1, 2] and enabled.skip.rollout.action == "repeat"


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (
            ["skip.rollout.steps=[1]"],
            "skip.rollout.steps is set, but nothing reads it: it applies with skip.rollout.enable=true",
        ),
        (
            ["skip.rollout.enable=true", "skip.rollout.steps=[1]", "actor_rollout_ref.hybrid_engine=false"],
            "hybrid_engine=false",
        ),
        (
            ["skip.rollout_tq.dump_dir=/tmp/tq_dumps"],
            "skip.rollout_tq.dump_dir is set, but nothing reads it: it applies with skip.rollout_tq.enable=true, "
            "a verl feature",
        ),
    ],
)
def test_the_composed_config_refuses_skip_settings_nothing_reads(overrides, match):
    from verl.workers.config import compose_ppo_config

    with pytest.raises(ValueError, match=match):
        compose_ppo_config(overrides)
