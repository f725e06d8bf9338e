"""Tests for the rollout registry and the validated sampling options."""

import pytest
from omegaconf import OmegaConf

from verl.workers.config import RolloutConfig, load_section
from verl.workers.rollout import (
    ROLLOUT_REGISTRY,
    BaseRollout,
    HFRollout,
    NaiveRollout,
    SamplingParams,
    get_rollout_cls,
    list_rollouts,
    register_rollout,
)


def test_builtin_rollouts_are_registered():
    assert {"hf", "naive"} <= set(list_rollouts())
    assert get_rollout_cls("hf") is HFRollout
    assert get_rollout_cls("naive") is NaiveRollout


def test_unknown_rollout_names_config_key_and_registered_names():
    with pytest.raises(ValueError) as info:
        get_rollout_cls("vllm_typo")
    message = str(info.value)
    assert "actor_rollout_ref.rollout.name" in message
    assert "hf" in message and "naive" in message


def test_register_custom_rollout_and_duplicate_rule():
    @register_rollout("test_custom_rollout")
    class CustomRollout(BaseRollout):
        def _generate_tokens(self, input_ids, attention_mask, params):
            return input_ids

    assert get_rollout_cls("test_custom_rollout") is CustomRollout
    register_rollout("test_custom_rollout")(CustomRollout)  # same class again: no-op

    class OtherRollout(BaseRollout):
        def _generate_tokens(self, input_ids, attention_mask, params):
            return input_ids

    with pytest.raises(ValueError, match="taken"):
        register_rollout("test_custom_rollout")(OtherRollout)
    assert ROLLOUT_REGISTRY.get("test_custom_rollout") is CustomRollout


FULL = {
    "response_length": 4,
    "n": 1,
    "temperature": 1.0,
    "top_k": -1,
    "top_p": 1.0,
    "do_sample": True,
    "seed": 0,
    "ignore_eos": False,
}


def test_every_option_is_read_and_extra_keys_are_ignored():
    params = SamplingParams.from_config(OmegaConf.create({**FULL, "name": "naive", "gpu_memory_utilization": 0.5}))
    assert params == SamplingParams(**FULL)
    assert not params.greedy


def test_a_missing_option_is_an_error_not_a_default():
    # the YAML holds the defaults; a rollout built from a partial mapping names what is missing
    partial = {key: value for key, value in FULL.items() if key not in ("top_p", "seed")}
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.top_p is missing"):
        SamplingParams.from_config(partial)
    with pytest.raises(TypeError):
        SamplingParams(response_length=4)  # no defaults in code


def test_sampling_options_of_the_config_are_the_yaml_values():
    config = load_section(RolloutConfig, {"temperature": 0.7, "n": 3, "seed": 5})
    params = config.sampling_options(seed_offset=2)
    assert (params.temperature, params.n, params.seed) == (0.7, 3, 7)
    assert params.response_length == config.response_length


def test_interpolated_dictconfig_is_resolved():
    rollout = {**FULL, "response_length": "${data.max_response_length}"}
    config = OmegaConf.create({"data": {"max_response_length": 6}, "rollout": rollout})
    assert SamplingParams.from_config(config.rollout).response_length == 6


@pytest.mark.parametrize(
    ("overrides", "greedy"),
    [({"temperature": 0.0}, True), ({"do_sample": False}, True), ({"temperature": 0.7, "top_k": 0}, False)],
)
def test_greedy_flag(overrides, greedy):
    assert SamplingParams(**{**FULL, **overrides}).greedy is greedy


# Bad values, each with words of the one rule that the config section and a rollout's options both apply.
BAD_VALUES = [
    ("n", 0, ">= 1"),
    ("n", 1.5, "wrong type"),
    ("top_p", 1.5, "<= 1"),
    ("top_p", 0.0, "> 0.0"),  # would keep no token: refused by the config and the rollout alike
    ("top_p", -0.1, "> 0.0"),
    ("temperature", -1.0, ">= 0"),
    ("response_length", 0, ">= 1"),
    ("top_k", 2.5, "wrong type"),
    ("do_sample", "yes", "wrong type"),
    ("seed", "abc", "wrong type"),
    ("seed", -1, ">= 0"),
]


@pytest.mark.parametrize(("key", "value", "accepted"), BAD_VALUES)
def test_invalid_values_name_the_key_and_accepted_values(key, value, accepted):
    with pytest.raises(ValueError) as info:
        SamplingParams.from_config({**FULL, key: value})
    message = str(info.value)
    assert f"actor_rollout_ref.rollout.{key}" in message
    assert accepted in message
    assert repr(value) in message


@pytest.mark.parametrize(("key", "value", "accepted"), BAD_VALUES)
def test_the_config_section_refuses_the_same_values(key, value, accepted):
    with pytest.raises(ValueError, match=rf"actor_rollout_ref\.rollout\.{key}") as info:
        load_section(RolloutConfig, {key: value})
    assert accepted in str(info.value)


def test_rollouts_validate_config_at_construction():
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.top_p"):
        NaiveRollout(lambda *args: None, {**FULL, "top_p": 2.0}, pad_token_id=0, eos_token_id=1)


def test_meta_info_overrides_are_validated():
    params = SamplingParams(**{**FULL, "n": 4})
    overridden = params.with_overrides({"do_sample": False, "n": 1, "global_step": 3})
    assert (overridden.do_sample, overridden.n, overridden.response_length) == (False, 1, 4)
    assert params.with_overrides({}) is params
    with pytest.raises(ValueError, match=r"meta_info overrides actor_rollout_ref\.rollout\.n"):
        params.with_overrides({"n": 0})
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.top_p"):
        params.with_overrides({"top_p": 0.0})
