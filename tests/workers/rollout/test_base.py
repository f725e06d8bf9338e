"""Tests for the rollout registry and the validated sampling options."""

import pytest
from omegaconf import OmegaConf

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


def test_defaults_and_extra_keys_ignored():
    params = SamplingParams.from_config(OmegaConf.create({"name": "naive", "response_length": 4, "gpu_util": 0.5}))
    assert params == SamplingParams(response_length=4, n=1, temperature=1.0, top_k=-1, top_p=1.0, do_sample=True)
    assert not params.greedy


def test_interpolated_dictconfig_is_resolved():
    config = OmegaConf.create(
        {"data": {"max_response_length": 6}, "rollout": {"response_length": "${data.max_response_length}"}}
    )
    assert SamplingParams.from_config(config.rollout).response_length == 6


@pytest.mark.parametrize(
    ("overrides", "greedy"),
    [({"temperature": 0}, True), ({"do_sample": False}, True), ({"temperature": 0.7, "top_k": 0}, False)],
)
def test_greedy_flag(overrides, greedy):
    assert SamplingParams(response_length=2, **overrides).greedy is greedy


@pytest.mark.parametrize(
    ("key", "value", "accepted"),
    [
        ("n", 0, ">= 1"),
        ("n", 1.5, ">= 1"),
        ("top_p", 1.5, "[0, 1]"),
        ("top_p", -0.1, "[0, 1]"),
        ("temperature", -1.0, ">= 0"),
        ("response_length", 0, ">= 1"),
        ("top_k", 2.5, "integer"),
        ("do_sample", "yes", "true or false"),
        ("seed", "abc", "integer or null"),
    ],
)
def test_invalid_values_name_the_key_and_accepted_values(key, value, accepted):
    config = {"response_length": 4, key: value}
    with pytest.raises(ValueError) as info:
        SamplingParams.from_config(config)
    message = str(info.value)
    assert f"actor_rollout_ref.rollout.{key}" in message
    assert accepted in message
    assert repr(value) in message


def test_missing_response_length():
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.response_length"):
        SamplingParams.from_config({"n": 2})


def test_rollouts_validate_config_at_construction():
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.top_p"):
        NaiveRollout(lambda *args: None, {"response_length": 4, "top_p": 2.0}, pad_token_id=0, eos_token_id=1)


def test_meta_info_overrides_are_validated():
    params = SamplingParams(response_length=4, n=4, temperature=1.0)
    overridden = params.with_overrides({"do_sample": False, "n": 1, "global_step": 3})
    assert (overridden.do_sample, overridden.n, overridden.response_length) == (False, 1, 4)
    assert params.with_overrides({}) is params
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.n"):
        params.with_overrides({"n": 0})
