"""Tests for verl.trainer.ppo.group_advantages: the group-relative estimators added for verl's names.

Every expected number is worked out by hand in the comments. Outcome rewards sit on each row's last valid token, so a
row's score is its reward sum, and an advantage is broadcast over the valid tokens only.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.trainer.ppo import core_algos as ca


def _approx(tensor, expected, atol=1e-5):
    torch.testing.assert_close(tensor, torch.as_tensor(expected, dtype=tensor.dtype), atol=atol, rtol=1e-5)


def _outcome(scores, lengths, labels, width=3):
    """(B, width) rewards with each score on the row's last valid token, the mask, and the group labels."""
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    for i, (score, length) in enumerate(zip(scores, lengths, strict=True)):
        mask[i, :length] = 1.0
        rewards[i, length - 1] = score
    return rewards, mask, np.array(labels, dtype=object)


# ---------------------------------------------------------------------------------------------- rloo_vectorized


def test_rloo_vectorized_by_hand_and_its_singleton_rule():
    rewards, mask, uids = _outcome([1.0, 0.0, 2.0, 3.0, 1.0, 5.0], [3, 2, 3, 1, 3, 3], ["a", "a", "a", "b", "b", "c"])
    adv, returns = ca.compute_rloo_vectorized_outcome_advantage(rewards, mask, uids)
    # a: n = 3, sum 3 -> (3 s - 3) / 2 = 0, -1.5, 1.5 (= s - mean of the other two: 1 - 1, 0 - 1.5, 2 - 0.5)
    # b: n = 2, sum 4 -> 2 s - 4 = 2, -2; c: a group of one gets 0 (verl's rloo_vectorized)
    expected = [0.0, -1.5, 1.5, 2.0, -2.0, 0.0]
    _approx(adv[:, 0], expected)
    assert adv[1, 2].item() == 0.0 and adv[3, 1:].abs().sum().item() == 0.0  # padding gets nothing
    assert torch.equal(adv, returns)
    # the loop form agrees on groups of two or more, and keeps the score (5) for the group of one
    loop, _ = ca.compute_rloo_outcome_advantage(rewards, mask, uids)
    _approx(loop[:5], adv[:5])
    assert loop[5, 0].item() == pytest.approx(5.0)
    assert ca.get_adv_estimator_fn("rloo_vectorized") is ca.compute_rloo_vectorized_outcome_advantage


# ---------------------------------------------------------------------------------------------- grpo_passk


def test_grpo_passk_only_the_best_response_learns():
    rewards, mask, uids = _outcome([0.0, 3.0, 1.0, 1.0, 1.0], [2, 3, 1, 3, 3], ["a", "a", "a", "b", "b"])
    adv, returns = ca.compute_grpo_passk_outcome_advantage(rewards, mask, uids, norm_adv_by_std_in_grpo=False)
    # a: best 3 (row 1), runner-up 1 -> lead 2 on row 1 only; b: a tie for the best -> lead 0 everywhere
    _approx(adv[:, 0], [0.0, 2.0, 0.0, 0.0, 0.0])
    _approx(adv[1], [2.0, 2.0, 2.0])
    assert torch.equal(adv, returns)
    # normalised: a's scores 0, 3, 1 have mean 4/3 and unbiased var (16 + 25 + 1) / 9 / 2 = 7/3 -> 2 / sqrt(7/3)
    adv, _ = ca.compute_grpo_passk_outcome_advantage(rewards, mask, uids)
    assert adv[1, 0].item() == pytest.approx(2 / math.sqrt(7 / 3), rel=1e-5)
    # the flag comes from the algorithm config when not passed (the trainer's call)
    adv, _ = ca.get_adv_estimator_fn("grpo_passk")(
        token_level_rewards=rewards,
        response_mask=mask,
        index=uids,
        config=SimpleNamespace(norm_adv_by_std_in_grpo=False),
    )
    assert adv[1, 0].item() == pytest.approx(2.0)


def test_grpo_passk_refuses_a_group_of_one():
    rewards, mask, uids = _outcome([1.0, 0.0, 2.0], [1, 1, 1], ["a", "a", "solo"])
    with pytest.raises(ValueError, match="rollout.n"):
        ca.compute_grpo_passk_outcome_advantage(rewards, mask, uids)


# ---------------------------------------------------------------------------------------------- reinforce++ baseline


def test_reinforce_plus_plus_baseline_centres_per_group_then_whitens_per_token():
    rewards, mask, uids = _outcome([1.0, 0.0, 2.0, 2.0], [2, 2, 3, 1], ["a", "a", "b", "b"])
    adv, returns = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, uids)
    # centred: a 0.5, -0.5; b 0, 0. Over the 8 valid tokens: 0.5, 0.5, -0.5, -0.5, 0, 0, 0, 0 -> mean 0,
    # unbiased var 4 * 0.25 / 7 = 1/7 -> whitened +-0.5 * sqrt(7) on rows 0 and 1, 0 on rows 2 and 3
    half = 0.5 * math.sqrt(7)
    _approx(adv, [[half, half, 0.0], [-half, -half, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], atol=1e-4)
    assert torch.equal(adv, returns)


def test_reinforce_plus_plus_baseline_group_of_one_is_centred_on_zero():
    rewards, mask, uids = _outcome([3.0, 1.0], [1, 1], ["a", "b"])
    adv, _ = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, uids)
    # no baseline for groups of one: values 3, 1 -> mean 2, unbiased var 2 -> (+-1) / sqrt(2)
    _approx(adv[:, 0], [1 / math.sqrt(2), -1 / math.sqrt(2)], atol=1e-4)


# ---------------------------------------------------------------------------------------------- opo


def test_opo_length_weighted_baseline():
    rewards, mask, uids = _outcome([1.0, 0.0, 4.0], [3, 1, 2], ["a", "a", "b"])
    adv, returns = ca.compute_opo_outcome_advantage(rewards, mask, uids)
    # a: baseline (3 * 1 + 1 * 0) / (3 + 1) = 0.75 -> 0.25 and -0.75; b alone: baseline 0 -> 4
    _approx(adv, [[0.25, 0.25, 0.25], [-0.75, 0.0, 0.0], [4.0, 4.0, 0.0]])
    assert torch.equal(adv, returns)


# ---------------------------------------------------------------------------------------------- gpg


def test_gpg_rescales_by_the_share_of_nonzero_scores():
    rewards, mask, uids = _outcome([1.0, 0.0, 0.0, 0.0], [1, 2, 1, 1], ["a", "a", "b", "b"])
    adv, returns = ca.compute_gpg_outcome_advantage(rewards, mask, uids)
    # B = 4 rows, 1 non-zero score -> alpha 4; a: mean 0.5 -> 4 * (+-0.5) = +-2; b: all 0 -> 0
    _approx(adv[:, 0], [2.0, -2.0, 0.0, 0.0])
    _approx(adv[1], [-2.0, -2.0, 0.0])
    assert torch.equal(adv, returns)
    # f_norm divides; a passed alpha is recomputed from the batch, as in verl
    adv, _ = ca.compute_gpg_outcome_advantage(rewards, mask, uids, f_norm=2.0, alpha=100.0)
    _approx(adv[:, 0], [1.0, -1.0, 0.0, 0.0])
    # all scores 0: alpha = 4 / max(0, 1), and every advantage is 0
    zero, _ = ca.compute_gpg_outcome_advantage(torch.zeros(4, 3), mask, uids)
    assert zero.abs().sum().item() == 0.0


# ---------------------------------------------------------------------------------------------- gdpo


def _gdpo_inputs():
    # two components per response: format (1, 0 | 1, 0) and accuracy (0, 0 | 0, 10); one token per response
    non_tensor = {"fmt": np.array([1.0, 0.0, 1.0, 0.0]), "acc": np.array([0.0, 0.0, 0.0, 10.0])}
    uids = np.array(["a", "a", "b", "b"], dtype=object)
    rewards = torch.tensor([[1.0], [0.0], [1.0], [10.0]])  # the summed score, unused with components
    return rewards, torch.ones(4, 1), uids, non_tensor


def test_gdpo_normalises_each_component_before_adding():
    rewards, mask, uids, non_tensor = _gdpo_inputs()
    config = SimpleNamespace(norm_adv_by_std_in_grpo=True, gdpo_reward_keys=["fmt", "acc"], gdpo_reward_weights=None)
    adv, returns = ca.compute_gdpo_outcome_advantage(
        rewards, mask, uids, config=config, non_tensor_batch=non_tensor, batch={}
    )
    # GRPO per component, s = 0.5 / sqrt(0.5) = 0.70711: fmt -> a: +s, -s; b: +s, -s. acc -> a: 0, 0; b: -s, +s.
    # sum: a: +s, -s; b: 0, 0 (GRPO on the summed 1, 10 would give b -s, +s instead).
    # whitened over the 4 tokens: mean 0, unbiased var 2 s^2 / 3 -> +-sqrt(3/2), 0, 0
    _approx(adv[:, 0], [math.sqrt(1.5), -math.sqrt(1.5), 0.0, 0.0], atol=1e-4)
    assert torch.equal(adv, returns)
    # weights 1 and 2: b becomes s - 2s = -s and -s + 2s = s; all four are +-s -> var 4 s^2 / 3 -> +-sqrt(3)/2
    weighted = SimpleNamespace(
        norm_adv_by_std_in_grpo=True, gdpo_reward_keys=["fmt", "acc"], gdpo_reward_weights=[1, 2]
    )
    adv, _ = ca.compute_gdpo_outcome_advantage(
        rewards, mask, uids, config=weighted, non_tensor_batch=non_tensor, batch={}
    )
    half_root3 = math.sqrt(3) / 2
    _approx(adv[:, 0], [half_root3, -half_root3, -half_root3, half_root3], atol=1e-4)


def test_gdpo_without_components_is_whitened_grpo_of_the_sum():
    rewards, mask, uids, _ = _gdpo_inputs()
    # the trainer's generic call (no batch): scores 1, 0 | 1, 10 -> GRPO +s, -s | -s, +s -> whitened +-sqrt(3)/2
    adv, _ = ca.get_adv_estimator_fn("gdpo")(
        token_level_rewards=rewards,
        response_mask=mask,
        index=uids,
        config=SimpleNamespace(norm_adv_by_std_in_grpo=True),
    )
    half_root3 = math.sqrt(3) / 2
    _approx(adv[:, 0], [half_root3, -half_root3, -half_root3, half_root3], atol=1e-4)


def test_gdpo_errors_name_the_missing_key():
    rewards, mask, uids, non_tensor = _gdpo_inputs()
    no_keys = SimpleNamespace(norm_adv_by_std_in_grpo=True)
    with pytest.raises(ValueError, match="gdpo_reward_keys"):
        ca.compute_gdpo_outcome_advantage(rewards, mask, uids, config=no_keys, non_tensor_batch=non_tensor, batch={})
    missing = SimpleNamespace(norm_adv_by_std_in_grpo=True, gdpo_reward_keys=["fmt", "style"])
    with pytest.raises(ValueError, match="'style'"):
        ca.compute_gdpo_outcome_advantage(rewards, mask, uids, config=missing, non_tensor_batch=non_tensor, batch={})
    bad_weights = SimpleNamespace(norm_adv_by_std_in_grpo=True, gdpo_reward_keys=["fmt"], gdpo_reward_weights=[1, 2])
    with pytest.raises(ValueError, match="one weight per key"):
        ca.compute_gdpo_outcome_advantage(
            rewards, mask, uids, config=bad_weights, non_tensor_batch=non_tensor, batch={}
        )


# ---------------------------------------------------------------------------------------------- the trainer's call


@pytest.mark.parametrize(
    "name, row1",
    [
        # row 1 scores 0 in group "a" (scores 1 on 2 tokens, 0 on 3 tokens); see the tests above for each rule
        ("rloo_vectorized", -1.0),  # 0 - 1
        ("opo", -0.4),  # 0 - (2 * 1 + 3 * 0) / (2 + 3)
        ("gpg", -0.6),  # alpha = 6 rows / 5 non-zero scores = 1.2, times (0 - 0.5)
        ("gdpo", None),
        ("reinforce_plus_plus_baseline", None),
    ],
)
def test_new_estimators_accept_verls_generic_call(name, row1):
    # verl's trainer passes token_level_rewards, response_mask, config, index (+ reward_baselines when present)
    rewards, mask, uids = _outcome([1.0, 0.0, 1.0, 2.0, 3.0, 0.7], [2, 3, 3, 3, 3, 3], ["a", "a", "b", "b", "b", "c"])
    config = SimpleNamespace(gamma=1.0, lam=1.0, norm_adv_by_std_in_grpo=True)
    adv, returns = ca.get_adv_estimator_fn(name)(
        token_level_rewards=rewards, response_mask=mask, config=config, index=uids, reward_baselines=torch.zeros(6)
    )
    assert adv.shape == returns.shape == (6, 3)
    assert adv[0, 2].item() == 0.0  # row 0's pad position
    assert torch.isfinite(adv).all()
    if row1 is not None:
        assert adv[1, 0].item() == pytest.approx(row1, abs=1e-5)
