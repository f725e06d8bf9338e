"""Tests for verl.trainer.ppo.token_baselines: optimal_token_baseline and tir_optimal_token_baseline.

The per-token weight is w = 1 - 2 p + S with p = exp(old_log_prob) and S = sum_pi_squared. Every test uses p = 0.5,
so w = S, and W_t is the running sum of S over the valid tokens; the baselines are then worked out by hand.
"""

import math

import numpy as np
import pytest
import torch

from verl.trainer.ppo import core_algos as ca

HALF = math.log(0.5)


def _approx(tensor, expected, atol=1e-6):
    torch.testing.assert_close(tensor, torch.as_tensor(expected, dtype=tensor.dtype), atol=atol, rtol=1e-5)


def test_optimal_token_baseline_per_position():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])  # returns: row 0 [1, 1], row 1 [0, 0]
    mask = torch.ones(2, 2)
    old_log_probs = torch.full((2, 2), HALF)
    sum_pi_squared = torch.tensor([[0.25, 0.25], [0.75, 0.25]])  # W: row 0 [0.25, 0.5], row 1 [0.75, 1.0]
    uids = np.array(["a", "a"], dtype=object)
    adv, returns = ca.compute_optimal_token_baseline_advantage(rewards, mask, uids, old_log_probs, sum_pi_squared)
    # B_0 = (1 * 0.25 + 0 * 0.75) / (0.25 + 0.75) = 0.25; B_1 = (1 * 0.5 + 0 * 1.0) / (0.5 + 1.0) = 1/3
    _approx(returns, [[1.0, 1.0], [0.0, 0.0]])
    _approx(adv, [[0.75, 2 / 3], [-0.25, -1 / 3]])
    assert ca.get_adv_estimator_fn("optimal_token_baseline") is ca.compute_optimal_token_baseline_advantage


def _tail_batch():
    # row 0 has 3 tokens and scores 2 at the end (returns 2, 2, 2); row 1 has 1 token scoring 1 (returns 1, 0, 0)
    rewards = torch.tensor([[0.0, 0.0, 2.0], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # S = 0.5 everywhere: W row 0 [0.5, 1.0, 1.5], row 1 [0.5, (masked)]
    return rewards, mask, torch.full((2, 3), HALF), torch.full((2, 3), 0.5), np.array([0, 0])


def test_optimal_token_baseline_zero_tail():
    rewards, mask, old_log_probs, sum_pi_squared, uids = _tail_batch()
    # B_0 = (2 * 0.5 + 1 * 0.5) / 1.0 = 1.5; past position 0 only row 0 remains, so B_1 = B_2 = 2 (its own return)
    adv, _ = ca.compute_optimal_token_baseline_advantage(
        rewards, mask, uids, old_log_probs, sum_pi_squared, handle_zero_tail=False
    )
    _approx(adv, [[0.5, 0.0, 0.0], [-0.5, 0.0, 0.0]])
    # with the zero tail (default), row 0 is the unique longest: baseline 0 from the runner-up's length 1 on
    adv, _ = ca.compute_optimal_token_baseline_advantage(rewards, mask, uids, old_log_probs, sum_pi_squared)
    _approx(adv, [[0.5, 2.0, 2.0], [-0.5, 0.0, 0.0]])


def test_optimal_token_baseline_importance_weights_and_groups_of_one():
    rewards, mask, old_log_probs, sum_pi_squared, uids = _tail_batch()
    weights = torch.tensor([[1.0, 1.0, 1.0], [2.0, 1.0, 1.0]])
    # W scales by the squared weight: row 1's w at position 0 becomes 0.5 * 4 = 2.
    # B_0 = (2 * 0.5 + 1 * 2) / (0.5 + 2) = 1.2 -> advantages 0.8 and -0.2
    adv, _ = ca.compute_optimal_token_baseline_advantage(
        rewards, mask, uids, old_log_probs, sum_pi_squared, rollout_is_weights=weights
    )
    _approx(adv[:, 0], [0.8, -0.2])
    # each row alone: baseline 0, advantage = return
    alone, returns = ca.compute_optimal_token_baseline_advantage(
        rewards, mask, np.array([0, 1]), old_log_probs, sum_pi_squared
    )
    _approx(alone, returns)


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_token_baselines_need_the_actors_extra_inputs(name):
    rewards, mask, _, _, uids = _tail_batch()
    # the trainer's generic call carries no old_log_probs / sum_pi_squared
    with pytest.raises(ValueError, match="sum_pi_squared"):
        ca.get_adv_estimator_fn(name)(token_level_rewards=rewards, response_mask=mask, index=uids, config=None)


def _multi_turn_batch():
    # row 0: its own tokens at positions 0 and 2 (1 is a tool's output, 3 padding), reward 1 at position 2
    # row 1: its own tokens at 0 and 1, reward 0.5 at 1; row 2: no token of its own (empty), same group
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    return rewards, mask, torch.full((3, 4), HALF), torch.full((3, 4), 0.5), np.array(["g", "g", "g"], dtype=object)


def test_tir_optimal_token_baseline_aligns_by_own_tokens():
    rewards, mask, old_log_probs, sum_pi_squared, uids = _multi_turn_batch()
    adv, returns = ca.compute_multi_turn_optimal_token_baseline_advantage(
        rewards, mask, uids, old_log_probs, sum_pi_squared
    )
    # returns (reward-to-go over own tokens): row 0 [1, 1, 1, 0], row 1 [0.5, 0.5, 0, 0]
    _approx(returns[:2], [[1.0, 1.0, 1.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    # own tokens k = 0, 1: row 0 G [1, 1], W [0.5, 1.0]; row 1 G [0.5, 0.5], W [0.5, 1.0]; row 2 joins no group.
    # B_k0 = (1 * 0.5 + 0.5 * 0.5) / 1.0 = 0.75; B_k1 = (1 * 1 + 0.5 * 1) / 2 = 0.75
    _approx(adv, [[0.25, 0.0, 0.25, 0.0], [-0.25, -0.25, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def test_optimal_token_baseline_aligns_by_absolute_position_instead():
    rewards, mask, old_log_probs, sum_pi_squared, uids = _multi_turn_batch()
    adv, _ = ca.compute_optimal_token_baseline_advantage(rewards, mask, uids, old_log_probs, sum_pi_squared)
    # position 0: B = 0.75 as above. Position 1: only row 1 (G 0.5) -> B = 0.5. Position 2: only row 0 (G 1) -> B = 1.
    # Lengths 2, 2, 0: no unique longest, so no zero tail.
    _approx(adv, [[0.25, 0.0, 0.0, 0.0], [-0.25, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
