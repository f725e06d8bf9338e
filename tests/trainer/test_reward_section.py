"""verl's ``reward`` section drives the same reward machinery as the older keys (``build_reward_fn``, the trainer's).

The scoring function, the reward manager and DAPO's overlong penalty are built from the config exactly as a run
builds them, once from ``reward.*`` and once from ``reward_model.*`` / ``custom_reward_function.*``.
"""

import pytest
import torch

from verl.models.loading import load_tokenizer
from verl.protocol import DataProto
from verl.trainer.data_setup import build_reward_fn
from verl.workers.config import compose_ppo_config
from verl.workers.reward_manager import DAPORewardManager, GDPORewardManager, NaiveRewardManager

PAD = 0
# the tiny vocabulary's digits: '0'..'9' are ids 4..13
DIGITS = {str(d): 4 + d for d in range(10)}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture
def reward_file(tmp_path):
    """A verl-style reward file: the score is the number of characters of the response over 10."""
    path = tmp_path / "my_reward.py"
    path.write_text(
        "def length_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return len(solution_str) / 10\n"
    )
    return path


def _batch(lengths, response_length=8):
    """Responses of the given numbers of tokens (the digit '1' repeated), right-padded to ``response_length``."""
    responses = torch.full((len(lengths), response_length), PAD, dtype=torch.long)
    response_mask = torch.zeros_like(responses)
    for i, length in enumerate(lengths):
        responses[i, :length] = DIGITS["1"]
        response_mask[i, :length] = 1
    prompts = torch.ones((len(lengths), 2), dtype=torch.long)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "attention_mask": torch.cat([torch.ones_like(prompts), response_mask], dim=1),
        },
        non_tensors={"ground_truth": ["1"] * len(lengths), "data_source": ["mine"] * len(lengths)},
    )


def _last_token_rewards(manager, lengths):
    out = manager(_batch(lengths), return_dict=True)["reward_tensor"]
    return [out[i, length - 1].item() for i, length in enumerate(lengths)]


def test_the_new_keys_alone_run_the_custom_function_and_the_manager_named(reward_file, tokenizer):
    config = compose_ppo_config(
        [
            f"reward.custom_reward_function.path={reward_file}",
            "reward.custom_reward_function.name=length_score",
            "reward.reward_manager.name=dapo",
        ]
    )
    manager = build_reward_fn(config, tokenizer)
    assert type(manager) is DAPORewardManager
    # responses of 3 and 5 '1' tokens decode to '111' and '11111': length_score 3/10 and 5/10 (no penalty: off)
    assert _last_token_rewards(manager, [3, 5]) == pytest.approx([0.3, 0.5])
    # the default config runs the naive manager with the built-in dispatch: the section changed what ran
    assert type(build_reward_fn(compose_ppo_config(), tokenizer)) is NaiveRewardManager


# DAPO's overlong penalty as verl's DAPO scripts set it, once per spelling (sizes shrunk to an 8-token response)
BUFFER = ["overlong_buffer_cfg.enable=true", "overlong_buffer_cfg.len=4", "overlong_buffer_cfg.penalty_factor=0.5"]
BUFFER += ["overlong_buffer_cfg.log=true", "max_resp_len=8"]


@pytest.mark.parametrize("section", ["reward", "reward_model"])
def test_dapo_overlong_penalty_is_the_same_from_either_section(section, reward_file, tokenizer):
    manager_key = "reward.reward_manager.name" if section == "reward" else "reward_model.reward_manager"
    config = compose_ppo_config(
        [
            manager_key + "=dapo",
            f"custom_reward_function.path={reward_file}",
            "custom_reward_function.name=length_score",
            *[f"+{section}.reward_kwargs.{item}" for item in BUFFER],
        ]
    )
    manager = build_reward_fn(config, tokenizer)
    # penalty = min(0, -(length - (max_resp_len - len)) / len * penalty_factor), with max_resp_len 8, len 4, 0.5:
    #   length 8: -(8 - 4) / 4 * 0.5 = -0.5;  length 6: -(6 - 4) / 4 * 0.5 = -0.25;  length 3: +0.125 -> 0
    # added to length_score = length / 10:  8 -> 0.8 - 0.5 = 0.3;  6 -> 0.6 - 0.25 = 0.35;  3 -> 0.3
    assert _last_token_rewards(manager, [8, 6, 3]) == pytest.approx([0.3, 0.35, 0.3])
    extra = manager(_batch([8, 6, 3]), return_dict=True)["reward_extra_info"]
    assert extra["overlong_reward"] == pytest.approx([-0.5, -0.25, 0.0])
    assert extra["overlong"] == [True, True, False]


def test_both_sections_build_one_reward_config_for_dapo(reward_file):
    common = [f"custom_reward_function.path={reward_file}", "custom_reward_function.name=length_score"]
    new = compose_ppo_config(
        ["reward.reward_manager.name=dapo", *common, *[f"+reward.reward_kwargs.{item}" for item in BUFFER]]
    )
    old = compose_ppo_config(
        ["reward_model.reward_manager=dapo", *common, *[f"+reward_model.reward_kwargs.{item}" for item in BUFFER]]
    )
    assert new.reward_model == old.reward_model
    assert new.reward_model.reward_kwargs["overlong_buffer_cfg"]["len"] == 4


def test_verls_gdpo_manager_reports_each_component(tmp_path, tokenizer):
    """verl's gdpo example: reward.reward_manager.name=gdpo with a scorer returning its components in a dict."""
    path = tmp_path / "components.py"
    path.write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    accuracy, form = float(len(solution_str) == 3), 0.5\n"
        "    return {'score': accuracy + form, 'accuracy_reward': accuracy, 'format_reward': form}\n"
        "def plain(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return len(solution_str) / 10\n"
    )
    overrides = ["algorithm.adv_estimator=gdpo", "+algorithm.gdpo_reward_keys=[accuracy_reward,format_reward]"]
    overrides += ["reward.reward_manager.name=gdpo", f"reward.custom_reward_function.path={path}"]
    manager = build_reward_fn(compose_ppo_config([*overrides, "reward.custom_reward_function.name=score"]), tokenizer)
    assert type(manager) is GDPORewardManager
    # responses '111' and '11111': accuracy 1 and 0, format 0.5 each; score = their sum
    out = manager(_batch([3, 5]), return_dict=True)
    assert [out["reward_tensor"][0, 2].item(), out["reward_tensor"][1, 4].item()] == pytest.approx([1.5, 0.5])
    extra = out["reward_extra_info"]
    assert (extra["accuracy_reward"], extra["format_reward"]) == ([1.0, 0.0], [0.5, 0.5])
    # a plain float score is also the component acc, as in verl's gdpo manager: 3/10 and 5/10
    manager = build_reward_fn(compose_ppo_config([*overrides, "reward.custom_reward_function.name=plain"]), tokenizer)
    assert manager(_batch([3, 5]), return_dict=True)["reward_extra_info"]["acc"] == pytest.approx([0.3, 0.5])
