"""build_update_outcome_handler: names, auto, mappings with module, class paths, and every bad input."""

import sys

import pytest
import torch
from omegaconf import OmegaConf

from verl.workers.update_outcome import (
    FP16WarnAndCountHandler,
    StrictHandler,
    UpdateFailedError,
    UpdateOutcome,
    UpdateOutcomeHandler,
    build_update_outcome_handler,
    get_update_outcome_handler_cls,
    list_update_outcome_handlers,
    register_update_outcome_handler,
)

CUSTOM_MODULE = "tests.workers.update_outcome.custom_handler_module"


def failure(step):
    return UpdateOutcome(False, None, None, None, None, step=step)


@pytest.mark.parametrize(
    "dtype, expected",
    [
        ("float16", FP16WarnAndCountHandler),
        (torch.float16, FP16WarnAndCountHandler),
        ("bfloat16", StrictHandler),
        ("float32", StrictHandler),
        (torch.bfloat16, StrictHandler),
    ],
)
def test_auto_follows_the_dtype(dtype, expected):
    assert type(build_update_outcome_handler("auto", dtype=dtype)) is expected
    assert type(build_update_outcome_handler(None, dtype=dtype)) is expected


def test_a_dtype_spelling_the_config_refuses_is_an_error_not_strict():
    with pytest.raises(ValueError, match=r"dtype='fp16' is not a dtype name"):
        build_update_outcome_handler("auto", dtype="fp16")


def test_names_and_mappings():
    assert type(build_update_outcome_handler("strict", dtype="float16")) is StrictHandler
    handler = build_update_outcome_handler(
        {"name": "fp16_warn_and_count", "max_consecutive_failures": 3, "ignore_loss_scale_backoff": False},
        dtype="float16",
    )
    assert handler.max_consecutive_failures == 3 and handler.ignore_loss_scale_backoff is False
    # auto inside a mapping takes the parameters of the handler it resolves to
    handler = build_update_outcome_handler({"name": "auto", "max_consecutive_failures": 4}, dtype="float16")
    assert isinstance(handler, FP16WarnAndCountHandler) and handler.max_consecutive_failures == 4


def test_omegaconf_mapping():
    policy = OmegaConf.create({"name": "fp16_warn_and_count", "max_consecutive_failures": 2})
    assert build_update_outcome_handler(policy, dtype="float16").max_consecutive_failures == 2


def test_registry_contract():
    assert {"strict", "fp16_warn_and_count"} <= set(list_update_outcome_handlers())
    assert list_update_outcome_handlers() == sorted(list_update_outcome_handlers())
    assert get_update_outcome_handler_cls("strict") is StrictHandler
    # same class twice: no-op
    register_update_outcome_handler("strict")(StrictHandler)

    class Impostor(UpdateOutcomeHandler):
        def on_failure(self, outcome):
            pass

    with pytest.raises(ValueError, match="taken"):
        register_update_outcome_handler("strict")(Impostor)
    with pytest.raises(ValueError, match="UpdateOutcomeHandler subclasses"):
        register_update_outcome_handler("not_a_class")(object)
    with pytest.raises(ValueError, match=r"Registered: .*fp16_warn_and_count.*strict"):
        get_update_outcome_handler_cls("nope")


def test_custom_handler_selected_by_module_mapping():
    sys.modules.pop(CUSTOM_MODULE, None)
    handler = build_update_outcome_handler({"name": "test_every_other", "module": CUSTOM_MODULE}, dtype="float16")
    assert type(handler).__name__ == "EveryOtherHandler"
    handler.handle(failure(1))  # first failure tolerated
    with pytest.raises(UpdateFailedError, match="too many failures"):
        handler.handle(failure(2))


def test_class_path_name():
    handler = build_update_outcome_handler(
        {"name": f"{CUSTOM_MODULE}:EveryOtherHandler", "tolerance": 5}, dtype="float32"
    )
    assert handler.tolerance == 5


@pytest.mark.parametrize(
    "policy, match",
    [
        ("strcit", r"unknown update-outcome handler 'strcit'.*fp16_warn_and_count.*strict"),
        (
            {"name": "fp16_warn_and_count", "max_consecutive_failure": 3},
            r"max_consecutive_failure.*accepted.*max_consecutive_failures",
        ),
        ({"name": "strict", "max_consecutive_failures": 3}, r"does not take.*accepted: \(none\)"),
        ({"name": "fp16_warn_and_count", "max_consecutive_failures": "ten"}, "must be an integer"),
        ({"name": "fp16_warn_and_count", "max_consecutive_failures": 0}, ">= 1"),
        ({"name": "fp16_warn_and_count", "max_consecutive_failures": -2}, ">= 1"),
        ({"name": "fp16_warn_and_count", "max_consecutive_failures": True}, "must be an integer"),
        ({"name": "fp16_warn_and_count", "ignore_loss_scale_backoff": "yes"}, "true or false"),
        ({"max_consecutive_failures": 3}, "without 'name'"),
        ({"name": ""}, "non-empty string"),
        ({"name": "strict", "module": "no.such.module_xyz"}, r"could not be imported.*ModuleNotFoundError"),
        ({"name": "strict", "module": 3}, "importable module path"),
        (f"{CUSTOM_MODULE}:NotAHandler", "not an UpdateOutcomeHandler"),
        (f"{CUSTOM_MODULE}:Missing", "has no attribute 'Missing'"),
        ("no.such.module_xyz:Handler", "could not be imported"),
        (":Handler", "must look like"),
        (42, "must be a handler name or a mapping"),
    ],
)
def test_bad_input_fails_early_and_says_what_is_accepted(policy, match):
    with pytest.raises(ValueError, match=match) as info:
        build_update_outcome_handler(policy, dtype="float16")
    assert "actor_rollout_ref.actor.update_failure_policy" in str(info.value)


@pytest.mark.parametrize(
    "policy, written",
    [
        ("name: fp16_warn_and_count", "{name: fp16_warn_and_count}"),
        ("name:strict", "{name: strict}"),
        ("name: mine, module: my.handlers", "{name: mine, module: my.handlers}"),
    ],
)
def test_a_mapping_without_braces_is_named_with_its_right_form(policy, written):
    # Hydra hands `update_failure_policy=name: x` over as the string 'name: x', which read as the class path of a
    # module called 'name'
    with pytest.raises(ValueError) as info:
        build_update_outcome_handler(policy, dtype="float16")
    message = str(info.value)
    assert "a mapping written without its braces" in message and "could not be imported" not in message
    assert f"'actor_rollout_ref.actor.update_failure_policy={written}'" in message


def test_errors_name_the_critic_key_for_the_critic():
    with pytest.raises(ValueError, match=r"critic\.update_failure_policy"):
        build_update_outcome_handler("bogus", dtype="float16", role="critic")


def test_outcome_validates_step_and_role():
    with pytest.raises(ValueError, match="1-based"):
        UpdateOutcome(True, 1.0, None, None, None, step=0)
    with pytest.raises(ValueError, match="role"):
        UpdateOutcome(True, 1.0, None, None, None, step=1, role="")


def test_update_failed_error_pickles_with_its_outcome():
    import pickle

    err = UpdateFailedError("boom", failure(3))
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, UpdateFailedError) and str(back) == "boom" and back.step == 3
