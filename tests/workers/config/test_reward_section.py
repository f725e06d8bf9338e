"""verl's top-level ``reward`` section: folded into ``reward_model`` / ``custom_reward_function``, one description.

Each ``reward.*`` key defaults to its older twin; the one that is set wins, both set to different values is a start-up
error naming both keys (:mod:`verl.workers.config.reward`). Most cases change the composed default config in memory,
key by key as a Hydra override does (a changed key loses its interpolation, the others keep theirs), to compose once;
verl's own command-line spellings go through Hydra.
"""

import copy
import dataclasses
from typing import Any

import pytest
from omegaconf import OmegaConf

from verl.workers.config import PPOConfig, compose_ppo_config, compose_with_defaults
from verl.workers.config.reward import TWINS, RewardConfig, resolve_reward_section
from verl.workers.config.values import plain_values

RM = "reward_model"
RR = "reward.reward_model"
# a reward model as verl's current scripts describe it (run_qwen2-7b_rm style, sizes shrunk) ...
NEW_RM = {
    f"{RR}.enable": True,
    f"{RR}.model_path": "/models/rm",
    f"{RR}.rollout.name": "vllm",
    f"{RR}.rollout.gpu_memory_utilization": 0.8,
    f"{RR}.rollout.tensor_model_parallel_size": 1,
    f"{RR}.rollout.prompt_length": 96,
    f"{RR}.rollout.response_length": 32,
}
# ... and the same model in the older keys, under verl's reward loop (which the new section always means)
OLD_RM = {key.replace(f"{RR}.model_path", f"{RM}.model.path").replace(RR, RM): v for key, v in NEW_RM.items()}
OLD_RM[f"{RM}.use_reward_loop"] = True


@pytest.fixture(scope="module")
def default():
    return compose_with_defaults()


def validate(default, changes: dict[str, Any], with_defaults: bool = True) -> PPOConfig:
    """The default config with ``changes`` (dotted key -> value) set, validated (against its defaults, or alone)."""
    config = copy.deepcopy(default.config)
    for key, value in changes.items():
        OmegaConf.update(config, key, value, merge=False)
    return PPOConfig.from_omegaconf(config, defaults=default.defaults if with_defaults else None)


def _overrides(changes: dict[str, Any]) -> list[str]:
    return [f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in changes.items()]


def test_the_default_section_types_every_key_and_changes_nothing(default):
    values = plain_values(default.config)
    # the YAML section holds every field of the typed section (build_config refuses any other key)
    assert set(values["reward"]) == {field.name for field in dataclasses.fields(RewardConfig)}
    folded, origins = resolve_reward_section(values, default.defaults)
    assert origins == {}  # each reward.* default is its older twin's value
    assert folded == {key: value for key, value in values.items() if key != "reward"}
    # the defaults the section shows are the older keys' (interpolations): verl's naive manager, 8 workers, no model
    assert (values["reward"]["reward_manager"]["name"], values["reward"]["num_workers"]) == ("naive", 8)
    assert values["reward"]["reward_model"]["enable"] is False


def test_every_twin_exists_in_the_default_config(default):
    values = plain_values(default.config)
    for new, old in TWINS:
        node_new, node_old = values["reward"], values
        for part in new.split("."):
            node_new = node_new[part]
        for part in old.split("."):
            node_old = node_old[part]
        assert node_new == node_old, (new, old)


@pytest.mark.parametrize(
    "new, old",
    [
        ({"reward.reward_manager.name": "dapo"}, {f"{RM}.reward_manager": "dapo"}),
        ({"reward.num_workers": 3}, {f"{RM}.num_workers": 3}),
        (
            {"reward.custom_reward_function.path": "/r/my.py", "reward.custom_reward_function.name": "score"},
            {"custom_reward_function.path": "/r/my.py", "custom_reward_function.name": "score"},
        ),
        (
            {"reward.reward_manager.name": "dapo", "reward.reward_kwargs.max_resp_len": 9},
            {f"{RM}.reward_manager": "dapo", f"{RM}.reward_kwargs.max_resp_len": 9},
        ),
        (NEW_RM, OLD_RM),
    ],
)
def test_the_new_keys_build_the_same_config_as_the_old_ones(default, new, old):
    via_new, via_old = validate(default, new), validate(default, old)
    assert via_new == via_old
    assert via_new != validate(default, {})  # the setting took effect


def test_verls_command_line_for_a_reward_model_builds_the_older_keys_config():
    # through Hydra, as verl's script writes it (run_qwen2-7b_rm.sh's keys, sizes shrunk)
    via_new, via_old = compose_ppo_config(_overrides(NEW_RM)), compose_ppo_config(_overrides(OLD_RM))
    assert via_new.reward_model == via_old.reward_model
    rm = via_new.reward_model
    # verl's current release serves the reward model through its reward loop: the engine's context bounds the input
    assert (rm.enable, rm.model.path, rm.use_reward_loop) == (True, "/models/rm", True)
    assert rm.input_max_length == 96 + 32  # rollout.prompt_length + response_length, with max_length null
    assert rm.scores_by_token_budget  # no micro-batch size set: by tokens, as verl's engine batches
    assert (rm.rollout.gpu_memory_utilization, rm.rollout.tensor_model_parallel_size) == (0.8, 1)


def test_one_spelling_per_key_may_be_mixed_with_the_other(default):
    changes = {"reward.reward_manager.name": "dapo", "reward.reward_kwargs.max_resp_len": 9, f"{RM}.num_workers": 2}
    cfg = validate(default, changes | {f"{RM}.reward_kwargs.overlong_buffer_cfg.enable": False})
    assert (cfg.reward_model.reward_manager, cfg.reward_model.num_workers) == ("dapo", 2)
    # reward_kwargs combine key by key
    assert cfg.reward_model.reward_kwargs == {"max_resp_len": 9, "overlong_buffer_cfg": {"enable": False}}


def test_both_spellings_set_to_the_same_value_agree(default):
    assert validate(default, {"reward.num_workers": 4, f"{RM}.num_workers": 4}).reward_model.num_workers == 4


@pytest.mark.parametrize(
    "changes, new_key, old_key",
    [
        ({"reward.num_workers": 4, f"{RM}.num_workers": 2}, "reward.num_workers=4", f"{RM}.num_workers=2"),
        (
            {"reward.custom_reward_function.path": "a.py", "custom_reward_function.path": "b.py"},
            "reward.custom_reward_function.path='a.py'",
            "custom_reward_function.path='b.py'",
        ),
        (
            {"reward.reward_kwargs.max_resp_len": 8, f"{RM}.reward_kwargs.max_resp_len": 16},
            "reward.reward_kwargs.max_resp_len=8",
            f"{RM}.reward_kwargs.max_resp_len=16",
        ),
        ({f"{RR}.model_path": "/a", f"{RM}.model.path": "/b"}, f"{RR}.model_path='/a'", f"{RM}.model.path='/b'"),
        (
            {f"{RR}.rollout.prompt_length": 64, f"{RM}.rollout.prompt_length": 128},
            f"{RR}.rollout.prompt_length=64",
            f"{RM}.rollout.prompt_length=128",
        ),
    ],
)
def test_both_spellings_set_to_different_values_stop_the_start(default, changes, new_key, old_key):
    with pytest.raises(ValueError) as err:
        validate(default, changes)
    message = str(err.value)
    assert message.startswith(f"{new_key} and {old_key} disagree: they are one setting")
    assert "Set only one of them" in message


def test_a_conflict_from_the_command_line_names_both_keys():
    with pytest.raises(ValueError, match=r"^reward\.num_workers=4 and reward_model\.num_workers=2 disagree"):
        compose_ppo_config(["reward.num_workers=4", f"{RM}.num_workers=2"])


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"reward.reward_manager.source": "importlib"}, r"reward\.reward_manager\.source='importlib': reward managers"),
        ({"reward.reward_manager.module.path": "/m.py"}, r"reward\.reward_manager\.module\.path='/m\.py': loading"),
        ({"reward.reward_manager.module.name": "Mine"}, r"reward\.reward_manager\.module\.name is set, but nothing"),
        ({f"{RR}.enable_resource_pool": True}, rf"{RR}\.enable_resource_pool=true asks for a verl feature"),
        ({f"{RR}.nnodes": 2}, rf"{RR}\.nnodes is set, but nothing reads it"),
        ({f"{RR}.n_gpus_per_node": 4}, rf"{RR}\.n_gpus_per_node is set, but nothing reads it"),
        ({"reward.reward_manager.name": "bogus"}, r"reward\.reward_manager\.name='bogus' is not supported"),
        ({"reward.num_workers": 0}, r"reward\.num_workers must be an integer >= 1"),
        ({"reward.sandbox_fusion.url": "http://x"}, r"reward\.sandbox_fusion\.url='http://x' asks for verl's sandbox"),
        ({f"{RR}.rollout.name": "sglang"}, rf"{RR}\.rollout\.name='sglang': the reward loop's engines"),
        ({"reward.bogus": 1}, r"reward\.bogus is not a known config key"),
        ({f"{RR}.rollout.quantization": "fp8"}, rf"{RR}\.rollout\.quantization is not a known config key"),
        ({"reward.reward_kwargs": [1]}, r"reward\.reward_kwargs must be a mapping of keyword arguments"),
    ],
)
def test_what_the_section_refuses_is_named_by_its_key(default, changes, match):
    with pytest.raises(ValueError, match=match):
        validate(default, changes)


def test_an_error_on_a_value_from_the_section_names_the_key_that_was_set(default):
    # the check of reward_kwargs' names runs on the folded reward_model section; the message says where it came from
    with pytest.raises(ValueError, match=r"reward_model\.reward_kwargs\.bogus is not a keyword argument") as err:
        validate(default, {"reward.reward_kwargs.bogus": 1})
    assert "reward_model.reward_kwargs.bogus is set by reward.reward_kwargs.bogus" in str(err.value)


def test_without_the_defaults_a_value_of_the_section_that_differs_wins(default):
    # a composed config validated on its own (no defaults to compare with): reward.* was set where it differs
    changes = {"reward.reward_manager.name": "dapo", f"{RR}.rollout.prompt_length": 64}
    typed = validate(default, changes, with_defaults=False)
    assert typed.reward_model.reward_manager == "dapo"
    assert typed.reward_model.rollout.prompt_length == 64 and typed.reward_model.use_reward_loop
    # the older key alone: the section follows it (interpolation), so nothing differs
    assert validate(default, {f"{RM}.num_workers": 5}, with_defaults=False).reward_model.num_workers == 5


def test_a_config_without_the_section_validates_as_before(default):
    values = plain_values(default.config)
    del values["reward"]
    values[RM]["num_workers"] = 5
    assert PPOConfig.from_omegaconf(values).reward_model.num_workers == 5
    folded, origins = resolve_reward_section(values)
    assert (folded, origins) == (values, {})
